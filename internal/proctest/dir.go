package proctest

import (
	"os"
	"testing"
)

// memDir is where MkdirTemp puts directories when the machine has it: a
// tmpfs on Linux.
const memDir = "/dev/shm"

// MkdirTemp is os.MkdirTemp for what a test writes in bulk, its binaries and
// its servers' data: in GOTMPDIR when it is set (as the testing package's
// TempDir and the go command's work files; make test sets it to /dev/shm),
// else in memory (/dev/shm) where the machine has it, else in os.TempDir().
// In memory they neither fill a disk that the whole machine shares nor wait
// on its syncs. The caller removes it.
func MkdirTemp(pattern string) (string, error) {
	if d := os.Getenv("GOTMPDIR"); d != "" {
		return os.MkdirTemp(d, pattern)
	}
	if st, err := os.Stat(memDir); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp(memDir, pattern); err == nil {
			return d, nil
		}
	}
	return os.MkdirTemp("", pattern)
}

// TempDir is tb.TempDir() made by MkdirTemp: a directory of the test's own,
// removed when the test ends, for a server's data.
func TempDir(tb testing.TB) string {
	tb.Helper()
	d, err := MkdirTemp("proctest-")
	if err != nil {
		tb.Fatalf("proctest: temporary directory: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}
