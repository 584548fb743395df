package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Process tests of the hand-off (internal/jobs, chain.go) with real worker
// binaries: a hot order's waiters are handed the lock in the order they
// first contended, and no fault makes a hand-off run a task twice.

// park enqueues demo jobs ids on order, each once the one before is parked
// among the order's waiters (asynq's retry state): their contention order.
func (r *rig) park(order string, workMS int, ids ...string) {
	r.t.Helper()
	for _, id := range ids {
		r.enqueueDemo(id, order, workMS)
		r.waitTask(demo.Queue, id, asynq.TaskStateRetry, 10*time.Second)
	}
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
// order, each running to ok once, on the workers still alive. The holder's
// own task is recovered once its lock expired and waits at the end of the
// line: it runs to ok after the waiters.
func TestHandoffOrderAfterHolderKilled(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	workers := []*proc{r.worker(), r.worker(), r.worker()}
	r.enqueueDemo("holder", "hot", 5000)
	victim, _ := whoLogged(t, workers, "job started", "holder")
	waiters := names("w", 10)
	r.park("hot", 20, waiters...)

	killed := time.Now()
	victim.Kill()
	for _, id := range waiters {
		r.waitTask(demo.Queue, id, asynq.TaskStateCompleted, 20*time.Second)
	}
	drained := time.Since(killed)
	r.waitTask(demo.Queue, "holder", asynq.TaskStateCompleted, 20*time.Second)
	byOrder := r.check(append([]string{"holder"}, waiters...))
	got := taskIDs(byOrder["hot"])
	if want := append(slices.Clone(waiters), "holder"); !slices.Equal(got, want) {
		t.Errorf("ran to ok in the order %v, want the waiters' contention order, then the recovered holder: %v", got, want)
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
// worker; the task killed mid-run is recovered once its lock expired and
// runs once, after them. Every task ends ok exactly once.
func TestKilledChainRunsNoTaskTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	chainer := r.worker()
	r.enqueueDemo("first", "hot", 1500)
	chainer.started("first", 10*time.Second)
	waiters := names("c", 6)
	r.park("hot", 400, waiters...)
	other := r.worker() // only now: the chain is chainer's

	chainer.started("c01", 20*time.Second) // the second hand-off
	killed := time.Now()
	chainer.Kill()
	for _, id := range waiters {
		r.waitTask(demo.Queue, id, asynq.TaskStateCompleted, 30*time.Second)
	}
	t.Logf("waiters drained %v after the chain's worker was killed", time.Since(killed).Round(time.Millisecond))

	// "first" (active on the dead worker) is recovered by the live one.
	r.waitTask(demo.Queue, "first", asynq.TaskStateCompleted, 20*time.Second)
	all := append([]string{"first"}, waiters...)
	byOrder := r.check(all)
	// c01, cut short by the kill, waits again at the end; the parked
	// waiters keep their order across the dead chain.
	want := []string{"first", "c00", "c02", "c03", "c04", "c05", "c01"}
	if got := taskIDs(byOrder["hot"]); !slices.Equal(got, want) {
		t.Errorf("ran to ok in the order %v, want %v", got, want)
	}
	replayed := other.findLog(isReplay("first")) != nil
	if !replayed {
		t.Error("first was not replayed from its done marker on its redelivery")
	}
}

func isReplay(id string) func(map[string]any) bool {
	return proctest.Msg("task already ran under a hand-off; not run again", "id", id)
}

// Redis restarts (its data kept: append-only file) while a hot order's
// holder runs and eight waiters are parked: the order still drains, in
// order, and every task ends ok exactly once.
func TestRedisRestartWithParkedWaiters(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t, "appendonly", "yes", "appendfsync", "always"), testYAML)
	workers := []*proc{r.worker(), r.worker()}
	r.enqueueDemo("holder", "hot", 1500)
	whoLogged(t, workers, "job started", "holder")
	waiters := names("p", 8)
	r.park("hot", 20, waiters...)
	if info, err := r.insp.GetTaskInfo(demo.Queue, "holder"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("holder no longer running before the restart (%v, %v): make it work longer", info, err)
	}

	restarted := time.Now()
	r.rs.Restart()
	all := append([]string{"holder"}, waiters...)
	for _, id := range all {
		r.waitTask(demo.Queue, id, asynq.TaskStateCompleted, 60*time.Second)
	}
	t.Logf("all %d tasks completed %v after the restart", len(all), time.Since(restarted).Round(time.Millisecond))
	byOrder := r.check(all)
	if got := taskIDs(byOrder["hot"]); !slices.Equal(got[1:], waiters) {
		t.Errorf("waiters ran to ok in the order %v, want %v", got, waiters)
	}
}
