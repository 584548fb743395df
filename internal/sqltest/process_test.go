package sqltest

import (
	"strings"
	"testing"
)

// TestBinaryMissing: a server that is not installed is an error that says
// how to install it (tests then fail, never skip).
func TestBinaryMissing(t *testing.T) {
	_, err := binary("sqltest-no-such-server", "no-such-package", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y no-such-package") || !strings.Contains(err.Error(), "make test") {
		t.Fatalf("missing binary: %v, want an install hint", err)
	}
	if _, err := binary("initdb", "postgresql", pgBin); err != nil {
		t.Fatalf("initdb: %v", err)
	}
}
