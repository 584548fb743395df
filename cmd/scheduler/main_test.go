package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// bins holds this command's binary, built once for the package.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, bins, []string{"."}, redistest.LeakOptions()...))
}

// writeConfig writes a scheduler configuration for Redis at addr, with body
// appended, and returns its path.
func writeConfig(t *testing.T, addr, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := fmt.Sprintf("redis:\n  addr: %q\nlog:\n  format: json\n  level: info\n%s", addr, body)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// proc is one scheduler process.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited and its output is read

	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

// startProc starts the binary with args and extra environment variables.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bins["scheduler"], args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLog waits for a JSON log line whose msg is msg and returns it decoded.
func (p *proc) waitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for seen := 0; ; {
		p.mu.Lock()
		lines, changed := p.lines[seen:], p.changed
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == msg {
				return rec
			}
		}
		select {
		case <-changed:
		case <-p.done:
			p.t.Fatalf("process exited before logging %q; output:\n%s", msg, p.output())
		case <-deadline.C:
			p.t.Fatalf("no %q log within %v; output:\n%s", msg, timeout, p.output())
		}
	}
}

// httpAddr is where the process serves /metrics, /healthz and /readyz.
func (p *proc) httpAddr() string {
	p.t.Helper()
	return p.waitLog("metrics server listening", 10*time.Second)["addr"].(string)
}

// waitStatus polls path until it answers want, or fails after timeout.
func (p *proc) waitStatus(path string, want int, timeout time.Duration) string {
	p.t.Helper()
	url := "http://" + p.httpAddr() + path
	deadline := time.Now().Add(timeout)
	for {
		code, body := get(url)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("GET %s: %d %q after %v, want %d", path, code, body, timeout, want)
		}
		select {
		case <-p.done:
			p.t.Fatalf("process exited; output:\n%s", p.output())
		case <-time.After(50 * time.Millisecond): // polling an endpoint, the observable itself
		}
	}
}

func get(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// kill sends SIGKILL and waits for the process to exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// term sends SIGTERM and returns the exit code, failing after timeout.
func (p *proc) term(timeout time.Duration) int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("no exit within %v of SIGTERM; output:\n%s", timeout, p.output())
		return -1
	}
}

// exit waits for a process that is expected to end by itself.
func (p *proc) exit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("still running after %v; output:\n%s", timeout, p.output())
		return -1
	}
}

func TestValidateApp(t *testing.T) {
	t.Parallel()
	cfg := config.DefaultScheduler()
	cfg.Redis.Addr = "127.0.0.1:6379"
	if err := fx.ValidateApp(scheduler.AppOptions(cfg, slog.New(slog.DiscardHandler))); err != nil {
		t.Fatal(err)
	}
}

// The example configuration in configs/ loads and its schedules are valid.
func TestShippedConfigIsValid(t *testing.T) {
	t.Parallel()
	if _, err := scheduler.Load("../../configs/scheduler.yaml", "", func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
}

// --help prints the usage and exits 0, as the worker does.
func TestHelpExits0(t *testing.T) {
	t.Parallel()
	p := startProc(t, nil, "--help")
	if code := p.exit(10 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0; output:\n%s", code, p.output())
	}
	out := p.output()
	for _, w := range []string{"Usage: scheduler [--config FILE] [--http-addr HOST:PORT]", "-config", "-http-addr"} {
		if !strings.Contains(out, w) {
			t.Errorf("usage %q does not contain %q", out, w)
		}
	}
}
