package deploytest

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"` // named volumes
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command         []string `yaml:"command"`
	Environment     any      `yaml:"environment"` // a mapping or a list of NAME=value
	DependsOn       any      `yaml:"depends_on"`  // a list or a mapping
	StopGracePeriod string   `yaml:"stop_grace_period"`
	Volumes         []string `yaml:"volumes"`
	Ports           []string `yaml:"ports"`
}

func (s composeService) env() map[string]string {
	out := map[string]string{}
	switch e := s.Environment.(type) {
	case map[string]any:
		for k, v := range e {
			out[k] = fmt.Sprint(v)
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
			out[k] = v
		}
	}
	return out
}

func (s composeService) dependsOn() []string {
	var out []string
	switch d := s.DependsOn.(type) {
	case map[string]any:
		out = slices.Sorted(maps.Keys(d))
	case []any:
		for _, name := range d {
			out = append(out, fmt.Sprint(name))
		}
	}
	return out
}

// mounts maps each bind mount's target in the container to its source on the
// host, resolved against dir (the compose file's directory).
func (s composeService) mounts(dir string) map[string]string {
	out := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && (strings.HasPrefix(parts[0], ".") || strings.HasPrefix(parts[0], "/")) {
			out[parts[1]] = filepath.Join(dir, parts[0])
		}
	}
	return out
}

// prometheusConfig is the part of prometheus.yml the checks read.
type prometheusConfig struct {
	Global struct {
		ScrapeInterval string `yaml:"scrape_interval"`
	} `yaml:"global"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func (c prometheusConfig) targets() []string {
	var out []string
	for _, sc := range c.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			out = append(out, st.Targets...)
		}
	}
	return out
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// TestCompose checks deploy/compose.yaml against the Dockerfile, the config
// package, prometheus.yml and Grafana's provisioning.
func TestCompose(t *testing.T) {
	root := Root(t)
	dir := filepath.Join(root, "deploy")
	img := parseDockerfile(t, filepath.Join(dir, "Dockerfile"))
	var c composeFile
	readYAML(t, filepath.Join(dir, "compose.yaml"), &c)
	var prom prometheusConfig
	readYAML(t, filepath.Join(dir, "prometheus", "prometheus.yml"), &prom)
	targets := prom.targets()

	// Each mounted host path exists.
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		for target, src := range c.Services[name].mounts(dir) {
			if _, err := os.Stat(src); err != nil {
				t.Errorf("service %s: volume for %s: %v", name, target, err)
			}
		}
	}

	redis, ok := c.Services["redis"]
	if !ok {
		t.Fatalf("compose.yaml: no service redis")
	}
	if slices.Contains(redis.Command, "--port") {
		t.Errorf("service redis: the checks below assume the default port 6379")
	}

	roles := map[string][]string{} // role -> services
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if s.Build == nil {
			continue
		}
		where := "compose.yaml: service " + name
		if got := filepath.Join(dir, s.Build.Context); got != root {
			t.Errorf("%s: build context %s, want the repository root", where, s.Build.Context)
		}
		if s.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("%s: dockerfile %q, want deploy/Dockerfile", where, s.Build.Dockerfile)
		}
		inv, err := parseInvocation(img, s.Command)
		if err != nil {
			t.Errorf("%s: command %q: %v", where, s.Command, err)
			continue
		}
		roles[inv.role] = append(roles[inv.role], name)
		file, ok := img.file(inv.config)
		if !ok {
			t.Errorf("%s: --config %s is not in the image", where, inv.config)
			continue
		}
		cfg, ok := loadConfig(t, where, inv.role, filepath.Join(root, file), s.env())
		if !ok {
			continue
		}

		// Redis is the compose service, on its port.
		if host, p, err := net.SplitHostPort(cfg.redisAddr); err != nil || host != "redis" || p != "6379" {
			t.Errorf("%s: redis.addr %q, want redis:6379 (the compose service)", where, cfg.redisAddr)
		}
		if !slices.Contains(s.dependsOn(), "redis") {
			t.Errorf("%s: does not depend on redis", where)
		}

		// Prometheus scrapes it where it listens.
		httpAddr := cmp.Or(inv.httpAddr, cfg.httpAddr)
		target := net.JoinHostPort(name, fmt.Sprint(mustPort(t, httpAddr)))
		if !slices.Contains(targets, target) {
			t.Errorf("%s: listens on %s, but prometheus.yml does not scrape %s (targets %v)", where, httpAddr, target, targets)
		}

		// SIGKILL comes after running handlers had their shutdown_timeout.
		if cfg.shutdown > 0 {
			grace, err := time.ParseDuration(s.StopGracePeriod)
			if err != nil {
				t.Errorf("%s: stop_grace_period %q: %v (compose's default 10s is shorter than worker.shutdown_timeout %v)",
					where, s.StopGracePeriod, err, cfg.shutdown)
			} else if grace < cfg.shutdown+5*time.Second {
				t.Errorf("%s: stop_grace_period %v, want at least worker.shutdown_timeout %v + 5s", where, grace, cfg.shutdown)
			}
		}
	}
	if n := len(roles["scheduler"]); n != 2 {
		t.Errorf("compose.yaml runs %d schedulers %v, want 2", n, roles["scheduler"])
	}
	if n := len(roles["worker"]); n != 3 {
		t.Errorf("compose.yaml runs %d workers %v, want 3", n, roles["worker"])
	}

	// Every scrape target is a service of the file.
	for _, target := range targets {
		host, _, err := net.SplitHostPort(target)
		if err != nil {
			t.Errorf("prometheus.yml: target %q: %v", target, err)
		} else if _, ok := c.Services[host]; !ok && host != "localhost" {
			t.Errorf("prometheus.yml: target %q is no compose service", target)
		}
	}

	checkComposePrometheus(t, dir, c.Services["prometheus"], prom)
	checkComposeGrafana(t, dir, c, prom)
}

// checkComposePrometheus checks that the Prometheus service gets its config
// and every rule file it names.
func checkComposePrometheus(t *testing.T, dir string, s composeService, prom prometheusConfig) {
	const config = "/etc/prometheus/prometheus.yml" // the prom/prometheus image's default --config.file
	mounts := s.mounts(dir)
	if got, want := mounts[config], filepath.Join(dir, "prometheus", "prometheus.yml"); got != want {
		t.Errorf("service prometheus: %s comes from %q, want %s", config, got, want)
	}
	for _, rf := range prom.RuleFiles {
		in := path.Join(path.Dir(config), rf)
		src, ok := mounts[in]
		if !ok {
			t.Errorf("service prometheus: rule file %s (%s) is not mounted", rf, in)
		} else if want := filepath.Join(dir, "prometheus", rf); src != want {
			t.Errorf("service prometheus: %s comes from %s, want %s", in, src, want)
		}
	}
	if !slices.ContainsFunc(s.Ports, func(p string) bool { return strings.HasSuffix(p, ":9090") }) {
		t.Errorf("service prometheus: ports %v publish no container port 9090", s.Ports)
	}
}

// checkComposeGrafana checks the provisioning: the datasource reaches the
// compose Prometheus, and the dashboard provider finds the mounted dashboard.
func checkComposeGrafana(t *testing.T, dir string, c composeFile, prom prometheusConfig) {
	s, ok := c.Services["grafana"]
	if !ok {
		t.Fatalf("compose.yaml: no service grafana")
	}
	mounts := s.mounts(dir)
	prov := filepath.Join(dir, "grafana", "provisioning")
	if mounts["/etc/grafana/provisioning"] != prov {
		t.Errorf("service grafana: /etc/grafana/provisioning comes from %q, want %s", mounts["/etc/grafana/provisioning"], prov)
	}
	var dashboardAt string
	for target, src := range mounts {
		if src == filepath.Join(dir, "grafana", "lockstep.json") {
			dashboardAt = target
		}
	}
	if dashboardAt == "" {
		t.Fatalf("service grafana: grafana/lockstep.json is not mounted")
	}
	if home := s.env()["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" && home != dashboardAt {
		t.Errorf("service grafana: home dashboard %s, but the dashboard is mounted at %s", home, dashboardAt)
	}

	var ds struct {
		Datasources []struct {
			Name, UID, Type, URL string
			IsDefault            bool `yaml:"isDefault"`
			JSONData             struct {
				TimeInterval string `yaml:"timeInterval"`
			} `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yaml"), &ds)
	if len(ds.Datasources) != 1 {
		t.Fatalf("datasources: %d, want 1", len(ds.Datasources))
	}
	d := ds.Datasources[0]
	u, err := url.Parse(d.URL)
	if err != nil || u.Hostname() != "prometheus" || u.Port() != "9090" {
		t.Errorf("datasource url %q, want http://prometheus:9090 (the compose service)", d.URL)
	}
	if _, ok := c.Services[u.Hostname()]; !ok {
		t.Errorf("datasource url %q: no such compose service", d.URL)
	}
	if d.Type != "prometheus" || !d.IsDefault {
		t.Errorf("datasource %q: type %q default %v, want the default prometheus datasource", d.Name, d.Type, d.IsDefault)
	}
	if d.JSONData.TimeInterval != prom.Global.ScrapeInterval {
		t.Errorf("datasource timeInterval %q, want prometheus.yml's scrape_interval %q", d.JSONData.TimeInterval, prom.Global.ScrapeInterval)
	}

	var dp struct {
		Providers []struct {
			Name, Type string
			Options    struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(prov, "dashboards", "lockstep.yaml"), &dp)
	if len(dp.Providers) != 1 || dp.Providers[0].Type != "file" {
		t.Fatalf("dashboard providers %+v, want one of type file", dp.Providers)
	}
	if got := dp.Providers[0].Options.Path; got != path.Dir(dashboardAt) {
		t.Errorf("dashboard provider path %s, but the dashboard is mounted at %s", got, dashboardAt)
	}
}
