package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
)

// A whole chain leaves every task in the state asynq's own Inspector would
// report had asynq run each task itself, with asynq's own processed and
// failed counters (internal/asynqstore's contract test checks each of its
// operations alone; this test, the hand-off that uses them). A holder keeps
// the lock while one task of each kind parks behind it; its release hands
// the lock on through all of them in one chain.
func TestHandOffLeavesWhatAsynqReports(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[string]int{}
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:hot", "hot", func(ctx context.Context, job Job) error {
		mu.Lock()
		runs[job.ID]++
		n := runs[job.ID]
		mu.Unlock()
		switch job.ID {
		case "holder":
			<-release
		case "retried":
			if n == 1 {
				return errors.New("first attempt fails")
			}
		case "archived":
			return errors.New("always fails")
		case "timed-out":
			<-ctx.Done() // its own 1s timeout
			return ctx.Err()
		}
		return nil
	}))
	ctx := context.Background()
	enqueue := func(id string, opts ...asynq.Option) { t.Helper(); e.enqueueID("t:hot", id, opts...) }
	enqueue("holder")
	waitFor(t, 10*time.Second, "holder running", func() bool { mu.Lock(); defer mu.Unlock(); return runs["holder"] == 1 })
	kinds := []struct {
		id   string
		opts []asynq.Option
	}{
		{"plain", nil},
		{"kept", []asynq.Option{asynq.Retention(time.Hour)}},
		{"retried", []asynq.Option{asynq.MaxRetry(1), asynq.Retention(time.Hour)}},
		{"archived", []asynq.Option{asynq.MaxRetry(0)}},
		{"unique", []asynq.Option{asynq.Unique(time.Hour)}},
		{"timeout", []asynq.Option{asynq.Timeout(30 * time.Second)}},
		{"timed-out", []asynq.Option{asynq.Timeout(time.Second), asynq.MaxRetry(1)}},
	}
	for i, k := range kinds {
		enqueue(k.id, k.opts...)
		// Waiting behind the holder: parked, or (no retries left to requeue
		// with) waiting in its worker.
		waitFor(t, 10*time.Second, k.id+" waiting", func() bool {
			ws, err := e.locker.Waiters(ctx, "hot")
			return err == nil && len(ws) == i+1
		})
	}
	close(release)
	defer func() {
		if t.Failed() {
			q, _ := e.insp.GetQueueInfo("default")
			t.Logf("queue: %+v", q)
			for _, k := range kinds {
				info, err := e.insp.GetTaskInfo("default", k.id)
				if err == nil {
					t.Logf("%s: %s retried=%d err=%q next=%v", k.id, info.State, info.Retried, info.LastErr, info.NextProcessAt)
				}
			}
			mu.Lock()
			t.Logf("runs %v", runs)
			mu.Unlock()
		}
	}()
	// asynq retries a failure after 15 s or more (its default delay): run
	// the retries now, as an operator would.
	for _, id := range []string{"retried", "timed-out"} {
		waitFor(t, 20*time.Second, id+" failed once and run again", func() bool {
			info, err := e.insp.GetTaskInfo("default", id)
			return err == nil && info.State == asynq.TaskStateRetry && info.Retried == 1 && e.insp.RunTask("default", id) == nil
		})
	}
	waitFor(t, 30*time.Second, "every task done in asynq", func() bool {
		q, err := e.insp.GetQueueInfo("default")
		return err == nil && q.Pending+q.Active+q.Retry+q.Scheduled == 0 && q.Archived == 2
	})

	state := func(id string) string {
		info, err := e.insp.GetTaskInfo("default", id)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound):
			return "gone"
		case err != nil:
			t.Fatal(err)
		}
		return fmt.Sprintf("%s retried=%d", info.State, info.Retried)
	}
	want := map[string]string{
		"plain":     "gone", // completed without retention: deleted, as asynq's Done does
		"kept":      "completed retried=0",
		"retried":   "completed retried=1",
		"archived":  "archived retried=0",
		"unique":    "gone",
		"timeout":   "gone",
		"timed-out": "archived retried=1",
	}
	wantRuns := map[string]int{"holder": 1, "plain": 1, "kept": 1, "retried": 2, "archived": 1, "unique": 1, "timeout": 1, "timed-out": 2}
	for id, w := range want {
		if got := state(id); got != w {
			t.Errorf("%s: asynq reports %q, want %q", id, got, w)
		}
	}
	mu.Lock()
	for id, n := range wantRuns {
		if runs[id] != n {
			t.Errorf("%s ran %d times, want %d", id, runs[id], n)
		}
	}
	mu.Unlock()
	q, err := e.insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	// asynq counts a processed task once per run it reports, a failed one
	// once per failure: 10 runs, 4 of them failures.
	if q.Processed != 10 || q.Failed != 4 {
		t.Errorf("asynq counts processed %d, failed %d; want 10 and 4", q.Processed, q.Failed)
	}
	// Its uniqueness lock is freed: the same task can be enqueued again.
	if _, err := e.enq.Enqueue(asynq.NewTask("t:hot", []byte("unique")), asynq.Unique(time.Hour)); err != nil {
		t.Errorf("enqueue of the unique task's twin: %v (its uniqueness lock left)", err)
	}
}

// A worker linked against an asynq whose layout asynqstore does not know
// never writes it: the hand-off is off, and a contended task is requeued
// with its backoff (a failure-free retry that asynq itself schedules).
func TestUnknownAsynqVersionTurnsTheHandOffOff(t *testing.T) {
	// Not parallel: it swaps the package's view of the linked asynq.
	linked := linkedAsynq
	linkedAsynq = func() (string, bool) { return "v0.27.0", false }
	defer func() { linkedAsynq = linked }()
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		if job.ID == "holder" {
			<-release
		}
		return nil
	}))
	if e.srv.handsOff {
		t.Fatal("hand-off on with an unknown asynq")
	}
	e.enqueue("t:hot", "holder", nil)
	waitFor(t, 10*time.Second, "holder holding", func() bool { return e.admin.Exists(context.Background(), "lockstep:{hot}").Val() == 1 })
	e.enqueue("t:hot", "second", nil)
	e.waitState("second", asynq.TaskStateRetry, 10*time.Second)
	if n := e.admin.Exists(context.Background(), "lockstep:{hot}:queue").Val(); n != 0 {
		t.Error("a task joined the waiter queue with the hand-off off")
	}
	close(release)
	info := e.waitState("second", asynq.TaskStateCompleted, 20*time.Second)
	if info.Retried != 0 {
		t.Errorf("second retried %d times, want 0 (contention is no failure)", info.Retried)
	}
	if _, ok := asynqstore.Supported(); !ok {
		t.Error("this test binary's own asynq is not the one asynqstore knows")
	}
}
