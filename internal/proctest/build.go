package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"go.uber.org/goleak"
)

// Build compiles pkgs (import paths, or paths relative to the working
// directory) into dir with one go build, and returns each binary's path by
// its name (the package directory's base name). The binaries are built
// without the race detector (they are what a test runs, not what it checks)
// unless pkgs begins with go build flags, each one argument (-race,
// -tags=x): a test that checks the binary's own code passes -race.
func Build(dir string, pkgs ...string) (map[string]string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	if out, err := exec.Command(goTool, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		if strings.HasPrefix(p, "-") {
			continue // a flag
		}
		name := filepath.Base(p)
		if p == "." {
			wd, err := os.Getwd()
			if err != nil {
				return nil, err
			}
			name = filepath.Base(wd)
		}
		bins[name] = filepath.Join(dir, name)
	}
	return bins, nil
}

// Main is a TestMain for tests that run binaries: it builds pkgs (see
// Build) into a temporary directory, runs the tests with bins holding the
// binaries' paths by name, removes the directory, and after a passing run
// fails on leaked goroutines (goleak with opts). Use it as
//
//	func TestMain(m *testing.M) { os.Exit(proctest.Main(m, bins, []string{"."}, redistest.LeakOptions()...)) }
//
// m may be a wrapper of the *testing.M, e.g. sqltest.Main(m).
func Main(m interface{ Run() int }, bins map[string]string, pkgs []string, opts ...goleak.Option) int {
	dir, err := MkdirTemp("lockstep-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built, err := Build(dir, pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for name, path := range built {
		bins[name] = path
	}
	if code := m.Run(); code != 0 {
		return code
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
