package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// waitRun is one run of test:wait, from the stream test:waiter:runs.
type waitRun struct {
	id         string
	fence      int64
	start, end int64 // Unix ms; end 0 when the run never ended
}

func readWaitRuns(t *testing.T, c *redis.Client) []waitRun {
	t.Helper()
	msgs, err := c.XRange(context.Background(), "test:waiter:runs", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byRun := map[string]*waitRun{}
	var order []string
	for _, m := range msgs {
		id, _ := m.Values["task_id"].(string)
		fence, _ := strconv.ParseInt(m.Values["fence"].(string), 10, 64)
		at, _ := strconv.ParseInt(m.Values["at_ms"].(string), 10, 64)
		k := id + "/" + strconv.FormatInt(fence, 10)
		r := byRun[k]
		if r == nil {
			r = &waitRun{id: id, fence: fence}
			byRun[k] = r
			order = append(order, k)
		}
		if m.Values["event"] == "start" {
			r.start = at
		} else {
			r.end = at
		}
	}
	runs := make([]waitRun, 0, len(order))
	for _, k := range order {
		runs = append(runs, *byRun[k])
	}
	return runs
}

// waitsInWorker reports whether task id waits for its lock in a worker (the
// Wait policy marks its asynq hash while it does).
func waitsInWorker(c *redis.Client, id string) bool {
	return c.HGet(context.Background(), "asynq:{default}:t:"+id, "lockstep_waits").Val() == "1"
}

// The worker of a task that waits for its lock in the worker (Wait policy),
// first in line, is SIGKILLed. The holder's release hands the lock to that
// dead waiter; the grant expires within the lock's TTL and the next waiter,
// waiting in another worker, takes it then: the resource stalls no longer
// than the TTL. The dead waiter's task comes back when asynq recovers it and
// runs once. No two runs overlap, fences increase, and every task runs to
// its end exactly once.
func TestKilledFirstWaiterStallsNoLongerThanTheTTL(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), strings.Replace(testYAML, "concurrency: 4", "concurrency: 1", 1))
	ignorer := func() *proc { return r.start(bins["ignorer"], nil) }
	workers := []*proc{ignorer(), ignorer(), ignorer()}
	admin := r.admin
	enqueue := func(id string, workMS int) { t.Helper(); r.enqueueTest("test:wait", id, workMS) }

	enqueue("holder", 2500)
	holder, _ := whoLogged(t, workers, "job started", "holder")
	enqueue("first", 300)
	victim, _ := whoLogged(t, workers, "lock busy; task waits in the worker", "first")
	waitFor(t, 10*time.Second, "first waiting in its worker", func() bool { return waitsInWorker(admin, "first") })
	enqueue("second", 300)
	waitFor(t, 10*time.Second, "second waiting in its worker", func() bool { return waitsInWorker(admin, "second") })
	if victim == holder {
		t.Fatal("the holder's worker took the waiter too: concurrency is not 1")
	}
	victim.Kill()
	if runs := readWaitRuns(t, admin); len(runs) != 1 || runs[0].end != 0 {
		t.Fatalf("runs before the holder ended: %+v, want the holder's alone, still running", runs)
	}

	r.waitTask("default", "second", asynq.TaskStateCompleted, 20*time.Second)
	runs := readWaitRuns(t, admin)
	if len(runs) != 2 || runs[0].id != "holder" || runs[1].id != "second" {
		t.Fatalf("runs %+v, want holder then second", runs)
	}
	stall := time.Duration(runs[1].start-runs[0].end) * time.Millisecond
	// The grant to the dead waiter lasts one TTL; then the waiter's backoff
	// (contention_backoff_max 200ms) and a little.
	if stall > testTTL+time.Second {
		t.Errorf("second started %v after the holder ended, want within the TTL (%v) and its backoff", stall, testTTL)
	}
	t.Logf("first waiter's worker killed: the resource was idle %v between the holder and the next waiter (TTL %v)", stall, testTTL)

	// asynq recovers "first" (active on the dead worker) only for a worker
	// started once that is due.
	r.awaitRecovery("default", "first")
	ignorer()
	r.waitTask("default", "first", asynq.TaskStateCompleted, 60*time.Second)

	runs = readWaitRuns(t, admin)
	var ids []string
	for i, run := range runs {
		ids = append(ids, run.id)
		if run.end == 0 {
			t.Errorf("run %+v never ended", run)
		}
		if i > 0 && (run.start < runs[i-1].end || run.fence <= runs[i-1].fence) {
			t.Errorf("run %+v overlaps or does not follow %+v", run, runs[i-1])
		}
	}
	if want := []string{"holder", "second", "first"}; !slices.Equal(ids, want) {
		t.Errorf("ran %v, want %v, each once", ids, want)
	}
}
