package config

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writeFile writes content to a new file in a test-owned directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// envMap is a lookup function over a fixed environment.
func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// loadWorker loads a worker configuration from yml, failing the test on error.
func loadWorker(t *testing.T, yml string) *WorkerConfig {
	t.Helper()
	return mustLoad(t, LoadWorker, writeFile(t, "w.yaml", yml), nil)
}

// mustLoad is load(path, env) (LoadWorker or LoadScheduler), failing the
// test on error.
func mustLoad[C any](t *testing.T, load func(string, func(string) (string, bool)) (*C, error), path string,
	env func(string) (string, bool)) *C {
	t.Helper()
	c, err := load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
