package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Process tests of the hand-off (internal/jobs, chain.go) with real worker
// binaries: a hot order's waiters are handed the lock in the order they
// first contended, and no fault makes a hand-off run a task twice.

// hotRig is a private Redis, workers and the clients a test needs.
type hotRig struct {
	t     *testing.T
	rs    *redistest.Server
	admin *redis.Client
	enq   *asynq.Client
	insp  *asynq.Inspector
	cfg   string
	env   []string
}

func newHotRig(t *testing.T, directives ...string) *hotRig {
	rs := redistest.Start(t, directives...)
	admin := rs.Client()
	r := &hotRig{t: t, rs: rs, admin: admin, enq: asynq.NewClientFromRedisClient(admin),
		insp: asynq.NewInspectorFromRedisClient(admin), cfg: writeFile(t, "worker.yaml", testYAML),
		env: []string{"LOCKSTEP_REDIS_ADDR=" + rs.Addr}}
	t.Cleanup(func() { _ = r.enq.Close(); _ = r.insp.Close() })
	return r
}

func (r *hotRig) worker() *proc { return startWorker(r.t, r.env, "--config", r.cfg) }

// runner returns the worker that logged task id's start.
func (r *hotRig) runner(workers []*proc, id string) *proc {
	r.t.Helper()
	var w *proc
	waitFor(r.t, 10*time.Second, "task "+id+" to start", func() bool {
		for _, p := range workers {
			if p.findLog(func(m map[string]any) bool { return m["msg"] == "job started" && m["id"] == id }) != nil {
				w = p
				return true
			}
		}
		return false
	})
	return w
}

// park enqueues demo jobs ids on order, each once the one before is parked
// among the order's waiters (asynq's retry state): their contention order.
func (r *hotRig) park(order string, workMS int, ids ...string) {
	r.t.Helper()
	for _, id := range ids {
		enqueueDemo(r.t, r.enq, id, order, workMS)
		waitFor(r.t, 10*time.Second, id+" parked", func() bool {
			info, err := r.insp.GetTaskInfo(demo.Queue, id)
			return err == nil && info.State == asynq.TaskStateRetry
		})
	}
}

// check asserts the demo's records: ok executions never overlap and their
// fences increase, no stale write was accepted, and every task in ids ran to
// ok exactly once. It returns the ok executions by order, in start order.
func (r *hotRig) check(ids []string) map[string][]demo.Execution {
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

func taskIDs(xs []demo.Execution) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.TaskID
	}
	return out
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// The holder of a hot order is SIGKILLed with ten waiters parked: its lock
// expires within its TTL, the waiters come back after the lock's remaining
// TTL and the first to take it hands on to the rest, in their contention
// order, each running to ok once, on the workers still alive.
func TestHandoffOrderAfterHolderKilled(t *testing.T) {
	t.Parallel()
	r := newHotRig(t)
	workers := []*proc{r.worker(), r.worker(), r.worker()}
	enqueueDemo(t, r.enq, "holder", "hot", 5000)
	victim := r.runner(workers, "holder")
	waiters := names("w", 10)
	r.park("hot", 20, waiters...)

	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.wait(5 * time.Second)
	for _, id := range waiters {
		waitFor(t, 20*time.Second, id+" completed", func() bool {
			info, err := r.insp.GetTaskInfo(demo.Queue, id)
			return err == nil && info.State == asynq.TaskStateCompleted
		})
	}
	drained := time.Since(killed)
	byOrder := r.check(waiters)
	got := taskIDs(byOrder["hot"])
	if !slices.Equal(got, waiters) {
		t.Errorf("waiters ran in the order %v, want their contention order %v", got, waiters)
	}
	first := time.UnixMilli(byOrder["hot"][0].StartedMS).Sub(killed)
	// The TTL, asynq's whole-second retry times, its poll.
	if first > testTTL+2500*time.Millisecond {
		t.Errorf("first waiter started %v after the holder was killed, want within the TTL (%v) and a little", first, testTTL)
	}
	t.Logf("holder killed: first waiter started %v later (TTL %v), all %d drained in order %v later",
		first.Round(time.Millisecond), testTTL, len(waiters), drained.Round(time.Millisecond))
}

// The worker running a hand-off chain is SIGKILLed while it runs the second
// task handed on to it. The chain's first task (asynq's, finished but not
// yet acknowledged) is not run again when asynq recovers it: its done
// marker replays ok. The other waiters drain, in order, on the surviving
// worker; the task killed mid-run comes back when its lease passes and runs
// once, after them. Every task ends ok exactly once.
func TestKilledChainRunsNoTaskTwice(t *testing.T) {
	t.Parallel()
	r := newHotRig(t)
	chainer := r.worker()
	enqueueDemo(t, r.enq, "first", "hot", 1500)
	chainer.started("first", 10*time.Second)
	waiters := names("c", 6)
	r.park("hot", 400, waiters...)
	other := r.worker() // only now: the chain is chainer's

	chainer.started("c01", 20*time.Second) // the second hand-off
	killed := time.Now()
	if err := chainer.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	chainer.wait(5 * time.Second)
	for _, id := range waiters {
		waitFor(t, 30*time.Second, id+" completed", func() bool {
			info, err := r.insp.GetTaskInfo(demo.Queue, id)
			return err == nil && info.State == asynq.TaskStateCompleted
		})
	}
	t.Logf("waiters drained %v after the chain's worker was killed", time.Since(killed).Round(time.Millisecond))

	// asynq recovers "first" (active on the dead worker) once its lease has
	// been expired for 30s, from a recoverer that runs at a server's start
	// and then every minute: start a fresh worker once that is due.
	var orphaned time.Time
	waitFor(t, 45*time.Second, "first to be orphaned", func() bool {
		active, err := r.insp.ListActiveTasks(demo.Queue)
		if err != nil {
			return false
		}
		for _, a := range active {
			if a.ID == "first" && a.IsOrphaned {
				orphaned = time.Now()
				return true
			}
		}
		return false
	})
	time.Sleep(time.Until(orphaned.Add(31 * time.Second))) // asynq's fixed cutoff
	fresh := r.worker()
	waitFor(t, 60*time.Second, "first completed", func() bool {
		info, err := r.insp.GetTaskInfo(demo.Queue, "first")
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	all := append([]string{"first"}, waiters...)
	byOrder := r.check(all)
	// c01, cut short by the kill, waits again at the end; the parked
	// waiters keep their order across the dead chain.
	want := []string{"first", "c00", "c02", "c03", "c04", "c05", "c01"}
	if got := taskIDs(byOrder["hot"]); !slices.Equal(got, want) {
		t.Errorf("ran to ok in the order %v, want %v", got, want)
	}
	replayed := other.findLog(isReplay("first")) != nil || fresh.findLog(isReplay("first")) != nil
	if !replayed {
		t.Error("first was not replayed from its done marker on its redelivery")
	}
}

func isReplay(id string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		return m["msg"] == "task already ran under a hand-off; not run again" && m["id"] == id
	}
}

// Redis restarts (its data kept: append-only file) while a hot order's
// holder runs and eight waiters are parked: the order still drains, in
// order, and every task ends ok exactly once.
func TestRedisRestartWithParkedWaiters(t *testing.T) {
	t.Parallel()
	r := newHotRig(t, "appendonly", "yes", "appendfsync", "always")
	workers := []*proc{r.worker(), r.worker()}
	enqueueDemo(t, r.enq, "holder", "hot", 1500)
	r.runner(workers, "holder")
	waiters := names("p", 8)
	r.park("hot", 20, waiters...)
	if info, err := r.insp.GetTaskInfo(demo.Queue, "holder"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("holder no longer running before the restart (%v, %v): make it work longer", info, err)
	}

	restarted := time.Now()
	r.rs.Restart()
	all := append([]string{"holder"}, waiters...)
	for _, id := range all {
		waitFor(t, 60*time.Second, id+" completed", func() bool {
			info, err := r.insp.GetTaskInfo(demo.Queue, id)
			return err == nil && info.State == asynq.TaskStateCompleted
		})
	}
	t.Logf("all %d tasks completed %v after the restart", len(all), time.Since(restarted).Round(time.Millisecond))
	byOrder := r.check(all)
	if got := taskIDs(byOrder["hot"]); !slices.Equal(got[1:], waiters) {
		t.Errorf("waiters ran to ok in the order %v, want %v", got, waiters)
	}
}
