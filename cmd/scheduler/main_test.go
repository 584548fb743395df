package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// bins holds this command's binary, and the worker and the operator CLI
// that the overlap tests run beside it, built once for the package.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, bins, []string{".", "../worker", "../lockstep"}, redistest.LeakOptions()...))
}

// writeConfig writes a scheduler configuration for Redis at addr, with body
// appended, and returns its path.
func writeConfig(t *testing.T, addr, body string) string {
	t.Helper()
	return writeRedisConfig(t, fmt.Sprintf("  addr: %q\n", addr), body)
}

// writeRedisConfig is writeConfig with the redis section's lines.
func writeRedisConfig(t *testing.T, redis, body string) string {
	t.Helper()
	return proctest.WriteFile(t, "scheduler.yaml", fmt.Sprintf("redis:\n%slog:\n  format: json\n  level: info\n%s", redis, body))
}

// proc is one scheduler process and its log.
type proc struct {
	*proctest.Proc
	t   *testing.T
	log proctest.Log
}

// startProc starts the binary with args and extra environment variables; it
// is killed when the test ends.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t}
	p.Proc = proctest.Start(t, proctest.Spec{What: "scheduler", Bin: bins["scheduler"], Args: args,
		Env: append(os.Environ(), env...), Output: &p.log})
	return p
}

func (p *proc) output() string { return p.log.String() }

// waitLog waits for a JSON log line whose msg is msg and returns it decoded.
func (p *proc) waitLog(msg string, timeout time.Duration) map[string]any {
	p.t.Helper()
	return p.log.Wait(p.t, 0, timeout, p.Exited(), strconv.Quote(msg), proctest.Msg(msg))
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
	exited := p.Exited()
	var code int
	var body string
	defer func() {
		if code != want {
			p.t.Logf("GET %s, last answer: %d %q", path, code, body)
		}
	}()
	redistest.WaitEvery(p.t, timeout, 50*time.Millisecond, fmt.Sprintf("GET %s to answer %d", path, want), func() bool {
		select {
		case <-exited:
			p.t.Fatalf("process exited; output:\n%s", p.output())
		default:
		}
		code, body = get(url)
		return code == want
	})
	return body
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

// term sends SIGTERM and returns the exit code, failing after timeout.
func (p *proc) term(timeout time.Duration) int {
	p.t.Helper()
	code, exited := p.Term(timeout)
	return p.exitCode(code, exited, "no exit within %v of SIGTERM", timeout)
}

// exit waits for a process that is expected to end by itself.
func (p *proc) exit(timeout time.Duration) int {
	p.t.Helper()
	code, exited := p.Wait(timeout)
	return p.exitCode(code, exited, "still running after %v", timeout)
}

// exitCode returns code, or fails the test with why and the output when the
// process did not exit by itself.
func (p *proc) exitCode(code int, exited bool, why string, args ...any) int {
	p.t.Helper()
	if !exited {
		p.t.Fatalf(why+"; output:\n%s", append(args, p.output())...)
	}
	return code
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
