package deploytest

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// TestPromtool runs Debian's promtool on the Prometheus files: the rules
// parse, their unit tests in alerts_test.yml pass, and the compose
// configuration (with the rules it loads) is valid.
func TestPromtool(t *testing.T) {
	promtool := proctest.Binary(t, "promtool", "--no-install-recommends prometheus")
	dir := filepath.Join(Root(t), "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
		{"check", "config", "prometheus.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
