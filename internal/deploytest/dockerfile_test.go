package deploytest

import (
	"encoding/json"
	"go/build"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// image is what a stage of deploy/Dockerfile puts into its image.
// parseDockerfile returns the final stage's (the default target), with every
// named stage's in targets.
type image struct {
	name       string            // the stage's name (FROM ... AS name), "" if none
	base       string            // the stage's FROM
	user       string            // its USER
	binaries   map[string]string // path in the image -> package built ("cmd/worker")
	dirs       map[string]string // directory in the image -> directory of the build context ("configs")
	ports      []int             // EXPOSE
	entrypoint []string          // ENTRYPOINT (exec form)
	cmd        []string          // CMD (exec form)
	cgo        map[string]bool   // package -> built with CGO_ENABLED=0 (any stage)
	targets    map[string]*image // every named stage, by name (on the final stage's image)
}

type stage struct {
	name   string
	env    map[string]string
	builds map[string]string // output path -> package
}

// parseDockerfile reads the instructions the checks need. It understands the
// forms deploy/Dockerfile uses: exec-form CMD, `go build -o OUT ./cmd/X`
// joined by &&, COPY [--from=stage] SRC... DST.
func parseDockerfile(t *testing.T, file string) *image {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cgo, targets := map[string]bool{}, map[string]*image{}
	var img *image
	stages := map[string]*stage{}
	var cur *stage
	for _, line := range instructions(string(b)) {
		inst, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		f := strings.Fields(rest)
		switch strings.ToUpper(inst) {
		case "FROM":
			cur = &stage{env: map[string]string{}, builds: map[string]string{}}
			if parent, ok := stages[f[0]]; ok { // FROM an earlier stage: its ENV and its files
				maps.Copy(cur.env, parent.env)
				maps.Copy(cur.builds, parent.builds)
			}
			img = &image{base: f[0], binaries: map[string]string{}, dirs: map[string]string{}, cgo: cgo, targets: targets}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				cur.name, img.name = f[2], f[2]
				stages[cur.name] = cur
				targets[img.name] = img
			}
		case "ENV":
			for _, kv := range f {
				k, v, _ := strings.Cut(kv, "=")
				cur.env[k] = v
			}
		case "RUN":
			for cmd := range strings.SplitSeq(rest, "&&") {
				parseGoBuild(cur, img, strings.Fields(cmd))
			}
		case "COPY":
			var from string
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				if v, ok := strings.CutPrefix(f[0], "--from="); ok {
					from = v
				}
				f = f[1:]
			}
			if len(f) < 2 {
				t.Errorf("Dockerfile: COPY %s: want sources and a destination", rest)
				continue
			}
			srcs, dst := f[:len(f)-1], f[len(f)-1]
			for _, src := range srcs {
				if from != "" {
					st, ok := stages[from]
					if !ok {
						t.Errorf("Dockerfile: COPY --from=%s: no such stage", from)
						continue
					}
					pkg, ok := st.builds[src]
					if !ok {
						continue
					}
					at := dst
					if strings.HasSuffix(dst, "/") {
						at = path.Join(dst, path.Base(src))
					}
					img.binaries[at] = pkg
				} else if strings.HasSuffix(src, "/") {
					img.dirs[strings.TrimSuffix(dst, "/")] = strings.TrimSuffix(src, "/")
				}
			}
		case "USER":
			img.user = rest
		case "EXPOSE":
			for _, p := range f {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("Dockerfile: EXPOSE %s: %v", p, err)
				}
				img.ports = append(img.ports, n)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(rest), &img.cmd); err != nil {
				t.Errorf("Dockerfile: CMD %s: want the exec form (a JSON array): %v", rest, err)
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &img.entrypoint); err != nil {
				t.Errorf("Dockerfile: ENTRYPOINT %s: want the exec form (a JSON array): %v", rest, err)
			}
		}
	}
	if img == nil {
		t.Fatalf("Dockerfile: no FROM")
	}
	return img
}

// parseGoBuild records `[VAR=x ...] go build ... -o OUT PKG` in the stage.
func parseGoBuild(st *stage, img *image, f []string) {
	env := map[string]string{}
	for len(f) > 0 && strings.Contains(f[0], "=") && !strings.HasPrefix(f[0], "-") {
		k, v, _ := strings.Cut(f[0], "=")
		env[k] = v
		f = f[1:]
	}
	if len(f) < 2 || f[0] != "go" || f[1] != "build" {
		return
	}
	var out string
	for i := 2; i+1 < len(f); i++ {
		if f[i] == "-o" {
			out = f[i+1]
		}
	}
	pkg := strings.TrimPrefix(f[len(f)-1], "./")
	st.builds[out] = pkg
	img.cgo[pkg] = env["CGO_ENABLED"] == "0" || (env["CGO_ENABLED"] == "" && st.env["CGO_ENABLED"] == "0")
}

// instructions joins continuation lines and drops comments, --mount flags
// and parser directives.
func instructions(s string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		more := strings.HasSuffix(trimmed, "\\")
		cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
		cur.WriteString(" ")
		if !more {
			var words []string
			for _, w := range strings.Fields(cur.String()) {
				if !strings.HasPrefix(w, "--mount=") {
					words = append(words, w)
				}
			}
			out = append(out, strings.Join(words, " "))
			cur.Reset()
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	root := Root(t)
	img := parseDockerfile(t, filepath.Join(root, "deploy", "Dockerfile"))

	if !strings.Contains(img.base, "distroless/static") && img.base != "scratch" {
		t.Errorf("final stage FROM %s: want a static distroless image or scratch (the binaries are static)", img.base)
	}
	if u, _, _ := strings.Cut(img.user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("final stage USER %q: want a non-root user", img.user)
	}

	// Both binaries, built without cgo from main packages that exist.
	var pkgs []string
	for _, pkg := range img.binaries {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	if want := []string{"cmd/scheduler", "cmd/worker"}; !slices.Equal(pkgs, want) {
		t.Errorf("binaries in the image come from %v, want %v", pkgs, want)
	}
	for _, pkg := range pkgs {
		if !img.cgo[pkg] {
			t.Errorf("./%s is not built with CGO_ENABLED=0", pkg)
		}
		bp, err := build.ImportDir(filepath.Join(root, pkg), 0)
		if err != nil {
			t.Errorf("./%s: %v", pkg, err)
		} else if bp.Name != "main" {
			t.Errorf("./%s is package %s, want main", pkg, bp.Name)
		}
		if _, ok := loaders[path.Base(pkg)]; !ok {
			t.Errorf("./%s: the test has no configuration loader for it", pkg)
		}
	}

	// The example configs, where the commands below look for them.
	if got := img.dirs["/etc/lockstep"]; got != "configs" {
		t.Errorf("the image's /etc/lockstep comes from %q, want configs/", got)
	}

	// EXPOSE: the binaries' default http.addr ports.
	want := []int{mustPort(t, config.DefaultWorker().HTTP.Addr), mustPort(t, config.DefaultScheduler().HTTP.Addr)}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(img.ports))
	if !slices.Equal(got, want) {
		t.Errorf("EXPOSE %v, want the default http ports %v", got, want)
	}

	// The default command runs with the example config in the image.
	inv, err := parseInvocation(img, img.cmd)
	if err != nil {
		t.Errorf("CMD %q: %v", img.cmd, err)
	} else {
		file, ok := img.file(inv.config)
		if !ok {
			t.Errorf("CMD %q: %s is not in the image", img.cmd, inv.config)
		} else {
			loadConfig(t, "Dockerfile CMD", inv.role, filepath.Join(root, file), nil)
		}
	}

	// The ignore file keeps what the build needs.
	ignore, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile.dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pattern := range strings.Fields(string(ignore)) {
		if strings.HasPrefix(pattern, "#") {
			continue
		}
		for _, needed := range []string{"go.mod", "go.sum", "cmd/worker/main.go", "cmd/scheduler/main.go", "cmd/lockstep/main.go", "internal/config/config.go", "configs/worker.yaml"} {
			if ignored(pattern, needed) {
				t.Errorf("Dockerfile.dockerignore: %q excludes %s, which the build needs", pattern, needed)
			}
		}
	}
}

// file maps a path in the image to the file of the build context it was
// copied from.
func (img *image) file(p string) (string, bool) {
	for dir, src := range img.dirs {
		if rel, ok := strings.CutPrefix(p, dir+"/"); ok {
			return path.Join(src, rel), true
		}
	}
	return "", false
}

// ignored reports whether a .dockerignore pattern excludes name or one of
// its parent directories. Patterns match from the context root; those that
// start with **/ match at any depth.
func ignored(pattern, name string) bool {
	anyDepth := strings.HasPrefix(pattern, "**/")
	pattern = strings.TrimPrefix(pattern, "**/")
	parts := strings.Split(name, "/")
	for i := range parts {
		if i > 0 && !anyDepth {
			break
		}
		for j := i + 1; j <= len(parts); j++ {
			if ok, _ := path.Match(pattern, strings.Join(parts[i:j], "/")); ok {
				return true
			}
		}
	}
	return false
}

// TestDockerfileCLI checks the target "cli": the lockstep command alone,
// static, on distroless as a non-root user, run by its ENTRYPOINT; its
// default command (the built binary run with the image's CMD) exits 0.
func TestDockerfileCLI(t *testing.T) {
	t.Parallel()
	root := Root(t)
	img, ok := parseDockerfile(t, filepath.Join(root, "deploy", "Dockerfile")).targets["cli"]
	if !ok {
		t.Fatalf("deploy/Dockerfile has no stage named cli (docker build --target cli)")
	}
	if !strings.Contains(img.base, "distroless/static") && img.base != "scratch" {
		t.Errorf("cli: FROM %s: want a static distroless image or scratch", img.base)
	}
	if u, _, _ := strings.Cut(img.user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("cli: USER %q: want a non-root user", img.user)
	}
	const bin = "/usr/local/bin/lockstep"
	if want := map[string]string{bin: "cmd/lockstep"}; !maps.Equal(img.binaries, want) {
		t.Errorf("cli: binaries %v, want %v", img.binaries, want)
	}
	if !img.cgo["cmd/lockstep"] {
		t.Errorf("cli: ./cmd/lockstep is not built with CGO_ENABLED=0")
	}
	if len(img.dirs) > 0 {
		t.Errorf("cli: copies %v; the CLI reads LOCKSTEP_* variables and needs no file", img.dirs)
	}
	if !slices.Equal(img.entrypoint, []string{bin}) {
		t.Fatalf("cli: ENTRYPOINT %q, want [%q]", img.entrypoint, bin)
	}

	bins := buildBinaries(t, root, "lockstep")
	var out proctest.Log
	p := proctest.Start(t, proctest.Spec{What: "lockstep " + strings.Join(img.cmd, " "), Bin: bins["lockstep"], Args: img.cmd,
		Env: []string{"PATH=" + os.Getenv("PATH")}, Output: &out})
	code, exited := p.Wait(time.Minute)
	if !exited || code != 0 || !strings.Contains(out.String(), "usage: lockstep") {
		t.Errorf("cli: the default command %q exits %d (exited %v), want 0 with the usage:\n%s", img.cmd, code, exited, out.String())
	}
}
