package deploytest

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
)

// loaded is what the checks compare from a loaded configuration.
type loaded struct {
	httpAddr  string
	redisAddr string
	shutdown  time.Duration // worker.shutdown_timeout; 0 for the scheduler
}

// loaders load the configuration of each binary, named by its cmd/ directory.
var loaders = map[string]func(path string, env func(string) (string, bool)) (loaded, error){
	"scheduler": func(path string, env func(string) (string, bool)) (loaded, error) {
		c, err := config.LoadScheduler(path, env)
		if err != nil {
			return loaded{}, err
		}
		return loaded{httpAddr: c.HTTP.Addr, redisAddr: c.Redis.Addr}, nil
	},
	"worker": func(path string, env func(string) (string, bool)) (loaded, error) {
		c, err := config.LoadWorker(path, env)
		if err != nil {
			return loaded{}, err
		}
		return loaded{httpAddr: c.HTTP.Addr, redisAddr: c.Redis.Addr, shutdown: c.Worker.ShutdownTimeout}, nil
	},
}

// knownEnv returns the LOCKSTEP_* variables the role's configuration reads:
// the names the config package looks up while loading.
func knownEnv(role string) map[string]bool {
	seen := map[string]bool{}
	_, _ = loaders[role]("", func(name string) (string, bool) {
		seen[name] = true
		return "", false
	})
	return seen
}

// loadConfig loads the role's configuration from the file at path with the
// variables env, after checking that the config package knows every
// LOCKSTEP_* variable in env. where names the deploy file for errors.
func loadConfig(t *testing.T, where, role, path string, env map[string]string) (loaded, bool) {
	t.Helper()
	load, ok := loaders[role]
	if !ok {
		t.Errorf("%s: no configuration loader for role %q", where, role)
		return loaded{}, false
	}
	known := knownEnv(role)
	ok = true
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if strings.HasPrefix(name, "LOCKSTEP_") && !known[name] {
			t.Errorf("%s: the %s configuration has no variable %s (it reads %s)", where, role, name, strings.Join(slices.Sorted(maps.Keys(known)), ", "))
			ok = false
		}
	}
	if !ok {
		return loaded{}, false
	}
	c, err := load(path, func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	if err != nil {
		t.Errorf("%s: the %s configuration does not load: %v", where, role, err)
		return loaded{}, false
	}
	return c, true
}

// loadConfigText is loadConfig for configuration text embedded in a deploy
// file (a ConfigMap), written to a private temporary file named name.
func loadConfigText(t *testing.T, where, role, name, text string, env map[string]string) (loaded, bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return loadConfig(t, where, role, path, env)
}

// port returns the numeric port of host:port.
func port(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	p, err := port(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

// invocation is a parsed command line of a Lockstep binary.
type invocation struct {
	binary   string // path in the image
	role     string
	config   string // --config, as a path in the container
	httpAddr string // --http-addr, or ""
}

// parseInvocation reads argv (command and args) as a run of one of the
// image's binaries with the binaries' flags (--config, --http-addr).
func parseInvocation(img *image, argv []string) (invocation, error) {
	if len(argv) == 0 {
		return invocation{}, fmt.Errorf("no command")
	}
	inv := invocation{binary: argv[0]}
	pkg, ok := img.binaries[argv[0]]
	if !ok {
		return inv, fmt.Errorf("%s is not a binary the Dockerfile builds (%s)", argv[0], strings.Join(slices.Sorted(maps.Keys(img.binaries)), ", "))
	}
	inv.role = filepath.Base(pkg)
	for i := 1; i < len(argv); i++ {
		flag := argv[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(flag, "-"), "=")
		if !strings.HasPrefix(flag, "-") {
			return inv, fmt.Errorf("unexpected argument %q", flag)
		}
		if !hasVal {
			if i+1 == len(argv) {
				return inv, fmt.Errorf("flag %s has no value", flag)
			}
			i++
			val = argv[i]
		}
		switch name {
		case "config":
			inv.config = val
		case "http-addr":
			inv.httpAddr = val
		default:
			return inv, fmt.Errorf("unknown flag %q (the binaries take --config and --http-addr)", flag)
		}
	}
	if inv.config == "" {
		return inv, fmt.Errorf("no --config")
	}
	return inv, nil
}
