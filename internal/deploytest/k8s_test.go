package deploytest

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"` // ConfigMap
	Spec yaml.Node         `yaml:"spec"`
}

type deploymentSpec struct {
	Replicas *int        `yaml:"replicas"`
	Selector labelSelect `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"metadata"`
		Spec podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type labelSelect struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		PersistentVolumeClaim *struct {
			ClaimName string `yaml:"claimName"`
		} `yaml:"persistentVolumeClaim"`
	} `yaml:"volumes"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom any    `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
	TimeoutSeconds *int `yaml:"timeoutSeconds"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []servicePort     `yaml:"ports"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"` // a number or a port name
}

type pdbSpec struct {
	MinAvailable   any         `yaml:"minAvailable"`
	MaxUnavailable any         `yaml:"maxUnavailable"`
	Selector       labelSelect `yaml:"selector"`
}

// readK8s reads every object of every manifest in dir except the
// kustomization.
func readK8s(t *testing.T, dir string) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var objs []k8sObject
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" {
				continue // an empty document
			}
			o.file = filepath.Base(f)
			objs = append(objs, o)
		}
	}
	return objs
}

func (o k8sObject) where() string {
	return fmt.Sprintf("k8s/%s: %s %s", o.file, o.Kind, o.Metadata.Name)
}

func decodeSpec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var spec T
	if err := o.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s: spec: %v", o.where(), err)
	}
	return spec
}

// subset reports whether every label of sel is in labels (an empty selector
// selects nothing here: it would select every pod).
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetes checks deploy/k8s against the Dockerfile, the config package
// and itself: commands, ConfigMaps, env, ports, probes, Services, PDBs,
// grace periods and resources.
func TestKubernetes(t *testing.T) {
	root := Root(t)
	dir := filepath.Join(root, "deploy", "k8s")
	img := parseDockerfile(t, filepath.Join(root, "deploy", "Dockerfile"))
	objs := readK8s(t, dir)

	known := map[string]bool{"v1/ConfigMap": true, "v1/Service": true, "apps/v1/Deployment": true, "policy/v1/PodDisruptionBudget": true,
		"v1/PersistentVolumeClaim": true}
	byKind := map[string]map[string]k8sObject{}
	for _, o := range objs {
		if !known[o.APIVersion+"/"+o.Kind] {
			t.Errorf("%s: unexpected apiVersion/kind %s/%s", o.where(), o.APIVersion, o.Kind)
		}
		if byKind[o.Kind] == nil {
			byKind[o.Kind] = map[string]k8sObject{}
		}
		if _, dup := byKind[o.Kind][o.Metadata.Name]; dup {
			t.Errorf("%s: defined twice", o.where())
		}
		byKind[o.Kind][o.Metadata.Name] = o
	}

	checkKustomization(t, dir, objs)

	roles := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(byKind["Deployment"])) {
		o := byKind["Deployment"][name]
		d := decodeSpec[deploymentSpec](t, o)
		if !subset(d.Selector.MatchLabels, d.Template.Metadata.Labels) {
			t.Errorf("%s: selector %v does not select its pods %v", o.where(), d.Selector.MatchLabels, d.Template.Metadata.Labels)
		}
		for _, c := range d.Template.Spec.Containers {
			argv := append(slices.Clone(c.Command), c.Args...)
			if _, ok := img.binaries[first(argv)]; !ok {
				continue // not Lockstep (Redis)
			}
			role := checkLockstepContainer(t, o, d, c, img, byKind)
			if roles[role] {
				t.Errorf("%s: a second %s Deployment", o.where(), role)
			}
			if role != "" {
				roles[role] = true
			}
		}
	}
	for _, role := range slices.Sorted(maps.Keys(loaders)) {
		if !roles[role] {
			t.Errorf("k8s: no Deployment runs the %s", role)
		}
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// checkLockstepContainer checks one Lockstep container and what it needs
// around it, and returns its role.
func checkLockstepContainer(t *testing.T, o k8sObject, d deploymentSpec, c container, img *image, byKind map[string]map[string]k8sObject) string {
	where := fmt.Sprintf("%s container %s", o.where(), c.Name)
	pod := d.Template.Spec
	inv, err := parseInvocation(img, append(slices.Clone(c.Command), c.Args...))
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return ""
	}

	// The config comes from a ConfigMap mounted where --config points.
	var text string
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(inv.config, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm, ok := byKind["ConfigMap"][v.ConfigMap.Name]
			if !ok {
				t.Errorf("%s: ConfigMap %s is not defined", where, v.ConfigMap.Name)
				return inv.role
			}
			if text, ok = cm.Data[rel]; !ok {
				t.Errorf("%s: ConfigMap %s has no key %s (keys %v)", where, cm.Metadata.Name, rel, slices.Sorted(maps.Keys(cm.Data)))
				return inv.role
			}
		}
	}
	if text == "" {
		t.Errorf("%s: --config %s is not in a mounted ConfigMap", where, inv.config)
		return inv.role
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil {
			env[e.Name] = "from-" + e.Name // a Secret's value: any text must do
		}
	}
	cfg, ok := loadConfigText(t, where, inv.role, path.Base(inv.config), text, env)
	if !ok {
		return inv.role
	}

	// The metrics port: the container's "http" port, probes, Service, scrape annotations.
	httpPort := mustPort(t, cmp.Or(inv.httpAddr, cfg.httpAddr))
	var named int
	for _, p := range c.Ports {
		if p.Name == "http" {
			named = p.ContainerPort
		}
	}
	if named != httpPort {
		t.Errorf("%s: containerPort named http is %d, but the binary listens on %d", where, named, httpPort)
	}
	for _, pr := range []struct {
		name, path string
		p          *probe
	}{{"livenessProbe", "/healthz", c.LivenessProbe}, {"readinessProbe", "/readyz", c.ReadinessProbe}} {
		switch {
		case pr.p == nil || pr.p.HTTPGet == nil:
			t.Errorf("%s: no %s with httpGet %s", where, pr.name, pr.path)
		case pr.p.HTTPGet.Path != pr.path:
			t.Errorf("%s: %s path %s, want %s", where, pr.name, pr.p.HTTPGet.Path, pr.path)
		case resolvePort(pr.p.HTTPGet.Port, c) != httpPort:
			t.Errorf("%s: %s port %v, want the http port %d", where, pr.name, pr.p.HTTPGet.Port, httpPort)
		case pr.p.TimeoutSeconds != nil && *pr.p.TimeoutSeconds < 1:
			t.Errorf("%s: %s timeoutSeconds %d: /readyz takes up to 800ms", where, pr.name, *pr.p.TimeoutSeconds)
		}
	}
	ann := d.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(httpPort) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: scrape annotations %v, want scrape true, port %d, path /metrics", where, ann, httpPort)
	}
	var service bool
	for _, s := range byKind["Service"] {
		spec := decodeSpec[serviceSpec](t, s)
		if !subset(spec.Selector, d.Template.Metadata.Labels) {
			continue
		}
		for _, p := range spec.Ports {
			if resolvePort(p.TargetPort, c) != httpPort {
				continue
			}
			service = true
			if p.Port != httpPort {
				t.Errorf("%s: Service %s exposes the metrics port as %d, want %d as everywhere else", where, s.Metadata.Name, p.Port, httpPort)
			}
		}
	}
	if !service {
		t.Errorf("%s: no Service exposes its http port %d", where, httpPort)
	}

	// Redis: when the manifests define its Service, on its port.
	host, p, err := net.SplitHostPort(cfg.redisAddr)
	if err != nil {
		t.Errorf("%s: redis.addr %q: %v", where, cfg.redisAddr, err)
	} else if s, ok := byKind["Service"][host]; ok {
		spec := decodeSpec[serviceSpec](t, s)
		if !slices.ContainsFunc(spec.Ports, func(sp servicePort) bool { return strconv.Itoa(sp.Port) == p }) {
			t.Errorf("%s: redis.addr %s, but Service %s has no port %s", where, cfg.redisAddr, host, p)
		}
	}

	// A PodDisruptionBudget for the pods, and for no other Deployment's.
	var pdbs []string
	for _, b := range byKind["PodDisruptionBudget"] {
		spec := decodeSpec[pdbSpec](t, b)
		if subset(spec.Selector.MatchLabels, d.Template.Metadata.Labels) {
			pdbs = append(pdbs, b.Metadata.Name)
			if (spec.MinAvailable == nil) == (spec.MaxUnavailable == nil) {
				t.Errorf("%s: set one of minAvailable and maxUnavailable", b.where())
			}
			for _, other := range byKind["Deployment"] {
				od := decodeSpec[deploymentSpec](t, other)
				if other.Metadata.Name != o.Metadata.Name && subset(spec.Selector.MatchLabels, od.Template.Metadata.Labels) {
					t.Errorf("%s: also selects the pods of %s", b.where(), other.where())
				}
			}
		}
	}
	if len(pdbs) != 1 {
		t.Errorf("%s: PodDisruptionBudgets %v, want one", where, pdbs)
	}

	// SIGKILL comes after running handlers had their shutdown_timeout.
	grace := 30 * time.Second // Kubernetes' default
	if g := pod.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if cfg.shutdown > 0 && grace < cfg.shutdown+5*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want at least worker.shutdown_timeout %v + 5s", where, grace, cfg.shutdown)
	}

	if inv.role == "scheduler" && (d.Replicas == nil || *d.Replicas < 2) {
		t.Errorf("%s: want at least 2 scheduler replicas", where)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: resources %+v, want cpu and memory requests and a memory limit", where, c.Resources)
	}
	if !isTrue(pod.SecurityContext.RunAsNonRoot) && !isTrue(c.SecurityContext.RunAsNonRoot) {
		t.Errorf("%s: runAsNonRoot is not set", where)
	}
	return inv.role
}

func isTrue(b *bool) bool { return b != nil && *b }

// resolvePort returns the container port that a port number or name refers to.
func resolvePort(p any, c container) int {
	switch v := p.(type) {
	case int:
		return v
	case string:
		for _, cp := range c.Ports {
			if cp.Name == v {
				return cp.ContainerPort
			}
		}
	}
	return -1
}

// checkKustomization checks that the kustomization lists every manifest and
// names the image the Deployments use.
func checkKustomization(t *testing.T, dir string, objs []k8sObject) {
	t.Helper()
	var k struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name string `yaml:"name"`
		} `yaml:"images"`
	}
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &k)
	files := map[string]bool{}
	for _, o := range objs {
		files[o.file] = true
	}
	if got, want := slices.Sorted(slices.Values(k.Resources)), slices.Sorted(maps.Keys(files)); !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml: resources %v, want the manifests %v", got, want)
	}
	images := map[string]bool{}
	for _, im := range k.Images {
		images[im.Name] = true
	}
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		d := decodeSpec[deploymentSpec](t, o)
		for _, c := range d.Template.Spec.Containers {
			name, _, _ := strings.Cut(c.Image, ":")
			if strings.HasPrefix(name, "lockstep") && !images[name] {
				t.Errorf("%s: image %s is not in kustomization.yaml's images %v", o.where(), c.Image, slices.Sorted(maps.Keys(images)))
			}
		}
	}
}
