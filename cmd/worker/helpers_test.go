package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// bins holds the binaries the tests run, built once for the package:
// "worker" (this command), "ignorer" (testdata/ignorer: handlers
// test:ignore, test:wait and test:pay) and "withlock" (testdata/withlock: a user's
// program that locks its own code), race-enabled when the tests are.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(sqltest.Main(m), bins, append(raceFlags, ".", "./testdata/ignorer", "./testdata/withlock"), redistest.LeakOptions()...))
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
	// recoveryBound is how soon after a kill a live worker brings back a
	// task the dead one held without a lock: its beats (a third of the TTL)
	// are overdue after three, a look comes every 0.25-0.75 s, and a little
	// for a loaded machine.
	recoveryBound = 3*testTTL/3 + 3*time.Second
)

// writeFile writes a file of the test's own and returns its path.
var writeFile = proctest.WriteFile

// proc is one worker process and its JSON log.
type proc struct {
	*proctest.Proc
	t   *testing.T
	log proctest.Log
}

// startWorker starts the worker binary with args and only the environment
// given (plus PATH), killing it at the end of the test if still running.
func startWorker(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startBinary(t, bins["worker"], env, args...)
}

// startBinary is startWorker for another worker binary.
func startBinary(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t}
	// A race-enabled binary sleeps a second at exit unless told not to.
	p.Proc = proctest.New(t, proctest.Spec{What: filepath.Base(bin), Bin: bin, Args: args, Output: &p.log,
		Env: append([]string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0"}, env...)})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	pid := p.Pid()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("last lines of %s %d:\n%s", filepath.Base(bin), pid, p.log.Tail(40))
		}
	})
	return p
}

// waitLog waits for a log line that match accepts and returns it.
func (p *proc) waitLog(timeout time.Duration, what string, match func(map[string]any) bool) map[string]any {
	p.t.Helper()
	return p.log.Wait(p.t, 0, timeout, p.Exited(), what, match)
}

// findLog returns the first log line that match accepts, or nil.
func (p *proc) findLog(match func(map[string]any) bool) map[string]any { return p.log.Find(match) }

// allLogs returns everything the worker wrote so far.
func (p *proc) allLogs() string { return p.log.String() }

// httpAddr is the address the worker's metrics server listens on.
func (p *proc) httpAddr() string {
	p.t.Helper()
	return p.waitLog(10*time.Second, "the metrics server", proctest.Msg("metrics server listening"))["addr"].(string)
}

// started waits for the debug line of task id starting under its lock and
// returns its fence.
func (p *proc) started(id string, timeout time.Duration) int64 {
	p.t.Helper()
	return fenceOf(p.waitLog(timeout, "task "+id+" to start", proctest.Msg("job started", "id", id)))
}

func fenceOf(rec map[string]any) int64 { return int64(rec["fence"].(float64)) }

// wait waits for the process to exit by itself and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	code, exited := p.Wait(timeout)
	if !exited {
		p.t.Fatalf("worker still running %v later", timeout)
	}
	return code
}

// whoLogged waits until one of workers logs msg for task id and returns
// that worker and the record.
func whoLogged(t *testing.T, workers []*proc, msg, id string) (*proc, map[string]any) {
	t.Helper()
	var got *proc
	var rec map[string]any
	waitFor(t, 10*time.Second, id+": "+msg, func() bool {
		for _, w := range workers {
			if rec = w.findLog(proctest.Msg(msg, "id", id)); rec != nil {
				got = w
				return true
			}
		}
		return false
	})
	return got, rec
}

// rig is a private Redis, the clients a test needs to enqueue and inspect,
// and the environment and configuration its workers start with.
type rig struct {
	t     *testing.T
	rs    *redistest.Server
	admin *redis.Client
	enq   *asynq.Client
	insp  *asynq.Inspector
	cfg   string   // the workers' configuration file
	env   []string // the workers' environment
}

// newRig is a rig on rs whose workers run with the configuration yaml;
// opts configure the test's own client (a password, say).
func newRig(t *testing.T, rs *redistest.Server, yaml string, opts ...func(*redis.Options)) *rig {
	admin := rs.Client(opts...)
	r := &rig{t: t, rs: rs, admin: admin, enq: asynq.NewClientFromRedisClient(admin),
		insp: asynq.NewInspectorFromRedisClient(admin), cfg: writeFile(t, "worker.yaml", yaml),
		env: []string{"LOCKSTEP_REDIS_ADDR=" + rs.Addr}}
	t.Cleanup(func() { _ = r.enq.Close(); _ = r.insp.Close() })
	return r
}

// worker starts a worker process on the rig's Redis and configuration.
func (r *rig) worker() *proc { return r.start(bins["worker"], nil) }

// start starts bin on the rig's Redis and configuration, with env and args
// added.
func (r *rig) start(bin string, env []string, args ...string) *proc {
	r.t.Helper()
	return startBinary(r.t, bin, append(slices.Clip(r.env), env...), append([]string{"--config", r.cfg}, args...)...)
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

// ended waits for the demo execution with fence to end and returns it.
func (r *rig) ended(fence int64, timeout time.Duration) execution {
	r.t.Helper()
	var x execution
	waitFor(r.t, timeout, fmt.Sprintf("the execution with fence %d to end", fence), func() bool {
		for _, e := range readExecutions(r.t, r.admin) {
			if e.Fence == fence {
				x = e
			}
		}
		return x.Outcome != ""
	})
	return x
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

// check asserts the demo's records: ok executions never overlap and their
// fences increase, no stale write was accepted, and every task in ids ran to
// ok exactly once. It returns the ok executions by order, in start order.
func (r *rig) check(ids []string) map[string][]demo.Execution {
	r.t.Helper()
	ctx := context.Background()
	execs, err := demo.ReadExecutions(ctx, r.admin, "lockstep:")
	if err != nil {
		r.t.Fatal(err)
	}
	var oks []demo.Execution
	n := map[string]int{}
	for _, x := range execs {
		if x.Outcome == demo.OutcomeOK {
			oks = append(oks, x)
			n[x.TaskID]++
		}
	}
	for _, err := range demo.Overlaps(oks) {
		r.t.Error(err)
	}
	writes, err := demo.ReadWrites(ctx, r.admin, "lockstep:")
	if err != nil {
		r.t.Fatal(err)
	}
	for _, err := range demo.StaleWrites(writes) {
		r.t.Error(err)
	}
	for id, c := range demo.CompletedTwice(execs) {
		r.t.Errorf("task %s ran to ok %d times", id, c)
	}
	for _, id := range ids {
		if n[id] != 1 {
			r.t.Errorf("task %s ran to ok %d times, want once", id, n[id])
		}
	}
	return demo.ByOrder(oks)
}

// enqueue enqueues a task allowed 3 retries and kept an hour after
// completion, so that its retry count can be read.
func (r *rig) enqueue(typ, id string, payload string, opts ...asynq.Option) {
	r.t.Helper()
	opts = append([]asynq.Option{asynq.TaskID(id), asynq.MaxRetry(3), asynq.Retention(time.Hour)}, opts...)
	if _, err := r.enq.Enqueue(asynq.NewTask(typ, []byte(payload)), opts...); err != nil {
		r.t.Fatalf("enqueue %s: %v", id, err)
	}
}

// enqueueDemo enqueues a demo job (see enqueue).
func (r *rig) enqueueDemo(id, order string, workMS int, opts ...asynq.Option) {
	r.t.Helper()
	r.enqueue(demo.Type, id, fmt.Sprintf(`{"order_id":%q,"work_ms":%d}`, order, workMS), append([]asynq.Option{asynq.Queue(demo.Queue)}, opts...)...)
}

// enqueueTest enqueues a job of the ignorer's (test:ignore, test:wait) on
// key "k", on the default queue (see enqueue).
func (r *rig) enqueueTest(typ, id string, workMS int) {
	r.t.Helper()
	r.enqueue(typ, id, fmt.Sprintf(`{"key":"k","work_ms":%d}`, workMS))
}

// waitFor waits for an observable condition (see redistest.WaitFor).
var waitFor = redistest.WaitFor

// waitTask waits until task id of queue is in state and returns it.
func (r *rig) waitTask(queue, id string, state asynq.TaskState, timeout time.Duration) *asynq.TaskInfo {
	r.t.Helper()
	var info *asynq.TaskInfo
	waitFor(r.t, timeout, id+" "+state.String(), func() bool {
		var err error
		info, err = r.insp.GetTaskInfo(queue, id)
		return err == nil && info.State == state
	})
	return info
}

// waitCompleted waits until n tasks of the demo queue completed, failing at
// once if one is archived.
func (r *rig) waitCompleted(n int, timeout time.Duration) {
	r.t.Helper()
	t, insp := r.t, r.insp
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
