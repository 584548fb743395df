package acltest

import (
	"os"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// bins holds the worker, scheduler and lockstep binaries, built once.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, bins, []string{"../../cmd/worker", "../../cmd/scheduler", "../../cmd/lockstep"}, redistest.LeakOptions()...))
}
