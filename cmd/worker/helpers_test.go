package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// workerBin is the worker binary built once for the package's tests.
var workerBin string

// buildWorker builds this package into dir.
func buildWorker(dir string) (string, error) { return buildPackage(dir, "worker", ".") }

// buildPackage builds the command pkg (a path relative to this package) into
// dir as name, with the race detector when the tests have it.
func buildPackage(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if raceBuild {
		args = append(args, "-race")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, append(args, pkg)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// buildIgnorer builds the test worker of testdata/ignorer (handlers
// test:ignore and test:wait) for one test.
func buildIgnorer(t *testing.T) string {
	t.Helper()
	bin, err := buildPackage(t.TempDir(), "ignorer", "./testdata/ignorer")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// testYAML configures a quick worker: short lock TTL (renewed every 200ms),
// short contention backoff, HTTP on a free port, debug logs the tests read.
// Redis comes from LOCKSTEP_REDIS_ADDR.
const testYAML = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: debug
lock:
  ttl: 600ms
worker:
  concurrency: 4
  shutdown_timeout: 2s
  contention_backoff_min: 10ms
  contention_backoff_max: 200ms
`

const (
	testTTL             = 600 * time.Millisecond
	testRenewInterval   = testTTL / 3
	testShutdownTimeout = 2 * time.Second
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// proc is one worker process and the JSON log lines it wrote to stderr.
type proc struct {
	t   *testing.T
	cmd *exec.Cmd

	mu     sync.Mutex
	lines  []map[string]any
	raw    []string
	notify chan struct{} // closed and replaced on every new line

	exited chan struct{}
	state  *os.ProcessState
}

// startWorker starts the worker binary with args and only the environment
// given (plus PATH), killing it at the end of the test if still running.
func startWorker(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startBinary(t, workerBin, env, args...)
}

// startBinary is startWorker for another worker binary.
func startBinary(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// A race-enabled binary sleeps a second at exit unless told not to.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, notify: make(chan struct{}), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		p.scan(stderr)
	}()
	go func() {
		<-scanned // Wait closes the pipe: read everything first
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			p.dumpTail(40)
		}
	})
	return p
}

func (p *proc) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		_ = json.Unmarshal([]byte(line), &m)
		p.mu.Lock()
		p.raw = append(p.raw, line)
		if m != nil {
			p.lines = append(p.lines, m)
		}
		close(p.notify)
		p.notify = make(chan struct{})
		p.mu.Unlock()
	}
}

func (p *proc) dumpTail(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.t.Logf("last lines of worker %d:", p.cmd.Process.Pid)
	for _, l := range p.raw[max(0, len(p.raw)-n):] {
		p.t.Log("  " + l)
	}
}

// waitLog waits for a log line that match accepts and returns it.
func (p *proc) waitLog(timeout time.Duration, what string, match func(map[string]any) bool) map[string]any {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		p.mu.Lock()
		lines, notify := p.lines[seen:], p.notify
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				return l
			}
		}
		select {
		case <-notify:
		case <-p.exited:
			p.t.Fatalf("worker exited (%v) while waiting for %s", p.state, what)
		case <-deadline.C:
			p.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// findLog returns the first log line that match accepts, or nil.
func (p *proc) findLog(match func(map[string]any) bool) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if match(l) {
			return l
		}
	}
	return nil
}

// allLogs returns everything the worker wrote to stderr so far.
func (p *proc) allLogs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.raw, "\n")
}

// httpAddr is the address the worker's metrics server listens on.
func (p *proc) httpAddr() string {
	l := p.waitLog(10*time.Second, "the metrics server", func(m map[string]any) bool { return m["msg"] == "metrics server listening" })
	return l["addr"].(string)
}

// started waits for the debug line of task id starting under its lock and
// returns its fence.
func (p *proc) started(id string, timeout time.Duration) int64 {
	p.t.Helper()
	l := p.waitLog(timeout, "task "+id+" to start", func(m map[string]any) bool {
		return m["msg"] == "job started" && m["id"] == id
	})
	return int64(l["fence"].(float64))
}

// wait waits for the process to exit and returns its state.
func (p *proc) wait(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.state
	case <-time.After(timeout):
		p.t.Fatalf("worker still running %v later", timeout)
		return nil
	}
}

// execution is one entry of the demo stream.
type execution = demo.Execution

func readExecutions(t *testing.T, c *redis.Client) []execution {
	t.Helper()
	execs, err := demo.ReadExecutions(context.Background(), c, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	return execs
}

// checkExecutions asserts, per order, that no two executions overlap in time
// and that fences strictly increase in start order (demo.Overlaps). It
// returns the executions by order, in start order.
func checkExecutions(t *testing.T, execs []execution) map[string][]execution {
	t.Helper()
	for _, err := range demo.Overlaps(execs) {
		t.Error(err)
	}
	return demo.ByOrder(execs)
}

// enqueueDemo enqueues a demo job kept an hour after completion, so that its
// retry count can be read.
func enqueueDemo(t *testing.T, c *asynq.Client, id, order string, workMS int, opts ...asynq.Option) {
	t.Helper()
	payload := fmt.Sprintf(`{"order_id":%q,"work_ms":%d}`, order, workMS)
	opts = append([]asynq.Option{asynq.TaskID(id), asynq.MaxRetry(3), asynq.Retention(time.Hour), asynq.Queue(demo.Queue)}, opts...)
	_, err := c.Enqueue(asynq.NewTask(demo.Type, []byte(payload)), opts...)
	if err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
}

// waitFor waits for an observable condition (see redistest.WaitFor).
var waitFor = redistest.WaitFor

// waitCompleted waits until n tasks of the demo queue completed, failing at
// once if one is archived.
func waitCompleted(t *testing.T, insp *asynq.Inspector, n int, timeout time.Duration) {
	t.Helper()
	var q *asynq.QueueInfo
	waitFor(t, timeout, fmt.Sprintf("%d completed tasks", n), func() bool {
		var err error
		if q, err = insp.GetQueueInfo(demo.Queue); err != nil {
			return false
		}
		if q.Archived > 0 {
			archived, _ := insp.ListArchivedTasks(demo.Queue)
			for _, a := range archived {
				t.Errorf("archived %s: %s", a.ID, a.LastErr)
			}
			t.FailNow()
		}
		return q.Completed == n
	})
}
