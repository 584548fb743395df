package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Process tests of the one waiter queue: jobs parked by the worker binary
// and a WithLock caller in a separate process wait for an order in one
// queue, in arrival order, and a release hands the lock to whoever came
// first.

// waitersOf reads the order's queue as the operator's CLI does.
func (r *rig) waitersOf(order string) []lock.Waiter {
	r.t.Helper()
	ws, err := lock.New(r.admin).Waiters(context.Background(), demo.Resource(order))
	if err != nil {
		r.t.Fatal(err)
	}
	return ws
}

// A user's WithLock caller arrives while 20 jobs of 250ms hold and wait for
// order "mix"; 20 more jobs arrive after it. The caller gets the lock after
// the jobs that were waiting before it and before every job that came
// after it (at most one out of order each way), and never beside a job.
func TestWithLockCallerWaitsInArrivalOrderAmongJobs(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	r.worker()
	r.worker()
	before, after := names("a", 20), names("b", 20)
	for _, id := range before {
		r.enqueueDemo(id, "mix", 250)
	}
	// Every job of the first batch that is not running waits in the queue.
	waitFor(t, 20*time.Second, "the first batch parked in the order's queue", func() bool {
		return len(r.waitersOf("mix")) >= len(before)-2
	})
	caller := startBinary(t, bins["withlock"], r.env, "-key", demo.Resource("mix"), "-ttl", "5s", "-wait", "40s", "-hold", "100ms")
	var callerAt int
	waitFor(t, 10*time.Second, "the WithLock caller in the order's queue", func() bool {
		for _, w := range r.waitersOf("mix") {
			if w.TaskID == "" && w.Live {
				callerAt = w.Position
				return true
			}
		}
		return false
	})
	for _, id := range after {
		r.enqueueDemo(id, "mix", 250)
	}
	waitFor(t, 20*time.Second, "the second batch parked behind the caller", func() bool {
		n := 0
		for _, w := range r.waitersOf("mix") {
			if slices.Contains(after, w.TaskID) {
				n++
			}
		}
		return n == len(after)
	})
	got := caller.waitLog(60*time.Second, "the WithLock caller to hold the lock", proctest.Msg("acquired"))
	rel := caller.waitLog(10*time.Second, "the WithLock caller to release the lock", proctest.Msg("released"))
	if code := caller.wait(10 * time.Second); code != 0 {
		t.Fatalf("withlock exited %d\n%s", code, caller.allLogs())
	}
	r.waitCompleted(len(before)+len(after), 60*time.Second)
	byOrder := r.check(append(slices.Clone(before), after...))

	fence := int64(got["fence"].(float64))
	from, to := int64(got["at_ms"].(float64)), int64(rel["at_ms"].(float64))
	var late, early []string
	for _, x := range byOrder["mix"] {
		switch {
		case slices.Contains(before, x.TaskID) && x.Fence > fence:
			late = append(late, x.TaskID)
		case slices.Contains(after, x.TaskID) && x.Fence < fence:
			early = append(early, x.TaskID)
		}
		if x.StartedMS < to && from < x.FinishedMS {
			t.Errorf("job %s ran [%d, %d] beside the WithLock caller's hold [%d, %d]", x.TaskID, x.StartedMS, x.FinishedMS, from, to)
		}
	}
	t.Logf("caller joined at position %d; served after %d earlier jobs, %d earlier jobs after it, %d later jobs before it",
		callerAt, len(before)-len(late), len(late), len(early))
	if len(late) > 1 {
		t.Errorf("jobs that waited before the caller ran after it: %v (at most one out of order)", late)
	}
	if len(early) > 1 {
		t.Errorf("jobs that came after the caller ran before it: %v (at most one out of order)", early)
	}
}

// A WithLock caller that dies while it waits leaves the queue within its
// TTL: the jobs behind it are served, and the lock is not stuck with it.
func TestKilledWithLockWaiterLeavesTheQueue(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	w := r.worker()
	r.enqueueDemo("holder", "dead", 1500)
	w.started("holder", 10*time.Second)
	caller := startBinary(t, bins["withlock"], r.env, "-key", demo.Resource("dead"), "-ttl", "1s", "-wait", "40s")
	waitFor(t, 10*time.Second, "the WithLock caller in the queue", func() bool { return len(r.waitersOf("dead")) == 1 })
	ids := names("j", 3)
	for _, id := range ids {
		r.enqueueDemo(id, "dead", 50)
	}
	waitFor(t, 10*time.Second, "the jobs parked behind the caller", func() bool { return len(r.waitersOf("dead")) == 4 })
	caller.Kill()
	r.waitCompleted(1+len(ids), 20*time.Second)
	byOrder := r.check(append([]string{"holder"}, ids...))
	xs := byOrder["dead"]
	if len(xs) != 4 {
		t.Fatalf("executions %+v, want the holder and 3 jobs", xs)
	}
	// The dead caller was handed the lock (its hash outlives it by up to
	// its TTL) or skipped: either way the next job starts within that TTL.
	if stall := time.Duration(xs[1].StartedMS-xs[0].FinishedMS) * time.Millisecond; stall > time.Second+time.Second {
		t.Errorf("the job after the dead caller started %v after the holder ended, want within its TTL (1s) and a little", stall)
	}
	if n := len(r.waitersOf("dead")); n != 0 {
		t.Errorf("%d waiters left in the queue", n)
	}
}
