package chaos

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// readyTimeout bounds how long a started binary may take to answer /readyz.
const readyTimeout = 30 * time.Second

// build compiles cmd/scheduler and cmd/worker into dir (proctest.Build:
// without the race detector, the processes under test are the ones users run).
func build(tb testing.TB, dir string) (scheduler, worker string) {
	tb.Helper()
	bins, err := proctest.Build(dir, "github.com/lockstep-dev/lockstep/cmd/scheduler", "github.com/lockstep-dev/lockstep/cmd/worker")
	if err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	return bins["scheduler"], bins["worker"]
}

// role is one replica slot (scheduler-1, worker-2) whose process the faults
// kill, pause and restart; each incarnation is a new process with its own
// HTTP port and log file.
type role struct {
	name   string
	bin    string
	config string
	logDir string

	incarnation    int
	logs           []string // every incarnation's log file
	*proctest.Proc          // the current incarnation; nil before the first start
	http           string
}

// start starts a new incarnation and waits until it answers /readyz.
func (r *role) start(tb testing.TB) {
	tb.Helper()
	r.incarnation++
	port, err := proctest.FreePort()
	if err != nil {
		tb.Fatalf("chaos: free port: %v", err)
	}
	r.http = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	path := filepath.Join(r.logDir, fmt.Sprintf("%s.%d.log", r.name, r.incarnation))
	r.logs = append(r.logs, path)
	r.Proc = proctest.New(tb, proctest.Spec{
		What: r.name, Bin: r.bin, Args: []string{"--config", r.config, "--http-addr", r.http},
		Log: path, Ready: r.waitReady,
	})
	if err := r.Start(); err != nil {
		tb.Fatalf("chaos: %v", err)
	}
}

// waitReady waits until the process answers /readyz (proctest's Ready).
func (r *role) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			return fmt.Errorf("exited during start")
		default:
		}
		resp, err := client.Get("http://" + r.http + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v (last: %v)", readyTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // polling /readyz, the observable itself
	}
}

// kill sends SIGKILL and waits for the exit (nothing before the first start).
func (r *role) kill() {
	if r.Proc != nil {
		r.Kill()
	}
}

// term sends SIGTERM and waits up to timeout for the exit, then kills. It
// reports whether the process exited by itself.
func (r *role) term(timeout time.Duration) bool { return r.Proc == nil || r.Stop(timeout) }
