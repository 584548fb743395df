package acltest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// workerConfig runs the demo jobs with a short lock TTL, so that locks are
// renewed, contended and handed on within seconds.
const workerConfig = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: info
lock:
  ttl: 1s
worker:
  concurrency: 4
  shutdown_timeout: 2s
  contention_backoff_min: 50ms
  contention_backoff_max: 500ms
  demo: true
`

// schedulerConfig enqueues demo jobs every second: two schedules on one
// order (contention, waiters, hand-offs), one with an overlap policy (a
// schedule's run lock) and one on a limited resource (permits).
const schedulerConfig = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: info
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: 1s
  task_retention: 1h
schedules:
  - name: acl-pay-1
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "acl-1", "work_ms": 700}
  - name: acl-pay-1-again
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "acl-1", "work_ms": 500}
  - name: acl-pay-2
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "acl-2", "work_ms": 1200}
    overlap: skip
  - name: acl-tenant
    cron: "* * * * * *"
    task: demo:tenant.sync
    payload: {"tenant_id": "acl-t", "work_ms": 900}
`

// binProc is a running Lockstep binary and its JSON log.
type binProc struct {
	*proctest.Proc
	log proctest.Log
}

// startBinary starts the binary name with only PATH and env in its
// environment; it is killed when the test ends.
func startBinary(t *testing.T, name string, env []string, args ...string) *binProc {
	t.Helper()
	p := &binProc{}
	p.Proc = proctest.Start(t, proctest.Spec{What: name, Bin: bins[name], Args: args,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...), Output: &p.log})
	return p
}

// metricsAddr waits for the address the process's metrics server listens on.
func (p *binProc) metricsAddr(t *testing.T) string {
	t.Helper()
	rec := p.log.Wait(t, 0, 20*time.Second, p.Exited(), "the metrics server's address", func(m map[string]any) bool {
		return m["msg"] == "metrics server listening" && m["addr"] != ""
	})
	return rec["addr"].(string)
}

// runCLI runs lockstep with args and env to its end and returns its exit
// code and output (stdout and stderr).
func runCLI(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	var out proctest.Log
	p := proctest.Start(t, proctest.Spec{What: "lockstep " + strings.Join(args, " "), Bin: bins["lockstep"], Args: args,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...), Output: &out})
	code, exited := p.Wait(20 * time.Second)
	if !exited {
		t.Fatalf("lockstep %s: still running after 20s:\n%s", strings.Join(args, " "), out.String())
	}
	return code, out.String()
}

// waitDemoOK waits until the demo executions stream holds at least n ok
// outcomes, read through c.
func waitDemoOK(t *testing.T, c redis.UniversalClient, n int, timeout time.Duration) map[string]int {
	t.Helper()
	var outcomes map[string]int
	redistest.WaitFor(t, timeout, fmt.Sprintf("%d ok demo executions", n), func() bool {
		msgs, err := c.XRange(context.Background(), demo.Stream("lockstep:"), "-", "+").Result()
		if err != nil {
			return false
		}
		outcomes = map[string]int{}
		for _, m := range msgs {
			outcomes[fmt.Sprint(m.Values["outcome"])]++
		}
		return outcomes[demo.OutcomeOK] >= n
	})
	return outcomes
}

// scrape returns the text of http://addr/metrics.
func scrape(addr string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// repoFile returns the path of a file of the repository.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}
