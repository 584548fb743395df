package procid_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/procid"
)

func TestSelfIsHostColonPid(t *testing.T) {
	t.Parallel()
	host, pid, ok := strings.Cut(procid.Self(), ":")
	if !ok || host == "" || pid != strconv.Itoa(os.Getpid()) {
		t.Fatalf("Self() = %q, want host:%d", procid.Self(), os.Getpid())
	}
	if h, err := os.Hostname(); err == nil && h != "" && h != host {
		t.Fatalf("Self() = %q, want host %q", procid.Self(), h)
	}
	if got := procid.Of(42); got != host+":42" {
		t.Fatalf("Of(42) = %q, want %q", got, host+":42")
	}
}
