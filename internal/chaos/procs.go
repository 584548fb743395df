package chaos

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// readyTimeout bounds how long a started binary may take to answer /readyz.
const readyTimeout = 30 * time.Second

// build compiles cmd/scheduler and cmd/worker into dir, without the race
// detector (the processes under test are the ones users run).
func build(tb testing.TB, dir string) (scheduler, worker string) {
	tb.Helper()
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
		"github.com/lockstep-dev/lockstep/cmd/scheduler", "github.com/lockstep-dev/lockstep/cmd/worker")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("chaos: go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "scheduler"), filepath.Join(dir, "worker")
}

// role is one replica slot (scheduler-1, worker-2) whose process the faults
// kill and restart; each incarnation logs to its own file.
type role struct {
	name   string
	bin    string
	config string
	logDir string

	incarnation int
	logs        []string // every incarnation's log file
	cmd         *exec.Cmd
	done        chan struct{}
	http        string
}

// start starts a new incarnation and waits until it answers /readyz.
func (r *role) start(tb testing.TB) {
	tb.Helper()
	r.incarnation++
	port, err := redistest.FreePort()
	if err != nil {
		tb.Fatalf("chaos: free port: %v", err)
	}
	r.http = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	path := filepath.Join(r.logDir, fmt.Sprintf("%s.%d.log", r.name, r.incarnation))
	f, err := os.Create(path)
	if err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command(r.bin, "--config", r.config, "--http-addr", r.http)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the harness
	if err := cmd.Start(); err != nil {
		tb.Fatalf("chaos: start %s: %v", r.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.cmd, r.done = cmd, done
	r.logs = append(r.logs, path)
	if err := r.waitReady(readyTimeout); err != nil {
		log, _ := os.ReadFile(path)
		tb.Fatalf("chaos: %s: %v; log:\n%s", r.name, err, tail(log, 3000))
	}
}

func (r *role) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-r.done:
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
			return fmt.Errorf("not ready within %v (last: %v)", timeout, err)
		}
		time.Sleep(50 * time.Millisecond) // polling /readyz, the observable itself
	}
}

func (r *role) pid() int { return r.cmd.Process.Pid }

func (r *role) signal(sig syscall.Signal) { _ = r.cmd.Process.Signal(sig) }

// kill sends SIGKILL (a stopped process dies too) and waits for the exit.
func (r *role) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// term sends SIGTERM and waits up to timeout for the exit, then kills. It
// reports whether the process exited by itself.
func (r *role) term(timeout time.Duration) bool {
	if r.cmd == nil {
		return true
	}
	r.signal(syscall.SIGTERM)
	select {
	case <-r.done:
		r.cmd = nil
		return true
	case <-time.After(timeout):
		r.kill()
		return false
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
