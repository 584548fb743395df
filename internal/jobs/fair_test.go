package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A task both fair-shared and locked: its turn comes first, then its lock,
// whose one queue and hand-off serve it as before. Tenant A's 12 tasks are
// enqueued before tenant B's 4, all on one lock: every task completes once
// and unretried, no two runs overlap (the lock), the lock's waiters were
// handed it (tasks joined its queue), and B's tasks are not left until
// after A's (B's last run starts before A's last).
func TestFairAndLockedGoesThroughTheLocksQueue(t *testing.T) {
	t.Parallel()
	type run struct {
		id         string
		start, end time.Time
	}
	var mu sync.Mutex
	var runs []run
	spec := Spec{
		Type:     "t:fairlocked",
		Decode:   func(b []byte) (any, error) { return string(b), nil },
		Resource: func(any) string { return "lock:shared" },
		Fair:     func(p any) (string, int) { return strings.SplitN(p.(string), "-", 2)[0], 1 },
		Run: func(ctx context.Context, job Job, _ any) error {
			s := time.Now()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			runs = append(runs, run{job.ID, s, time.Now()})
			mu.Unlock()
			return nil
		},
	}
	cfg := testConfig()
	cfg.Concurrency = 2
	e := newEnv(t, cfg, spec)
	var ids []string
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("a-%02d", i))
	}
	for i := range 4 {
		ids = append(ids, fmt.Sprintf("b-%02d", i))
	}
	for _, id := range ids {
		e.enqueue("t:fairlocked", id, []byte(id), asynq.MaxRetry(5))
	}
	for _, id := range ids {
		if info := e.waitState(id, asynq.TaskStateCompleted, 30*time.Second); info.Retried != 0 {
			t.Errorf("%s completed with retried %d, want 0", id, info.Retried)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(runs, func(x, y run) int { return x.start.Compare(y.start) })
	seen := map[string]bool{}
	var lastA, lastB time.Time
	for i, r := range runs {
		if seen[r.id] {
			t.Errorf("%s ran twice", r.id)
		}
		seen[r.id] = true
		if i > 0 && r.start.Before(runs[i-1].end) {
			t.Errorf("%s started before %s ended: two holders of one lock", r.id, runs[i-1].id)
		}
		if r.id[0] == 'a' {
			lastA = r.start
		} else {
			lastB = r.start
		}
	}
	if len(runs) != len(ids) {
		t.Errorf("%d runs, want %d", len(runs), len(ids))
	}
	if !lastB.Before(lastA) {
		t.Errorf("B's last task started after A's last: no fair share")
	}
	if e.contended("t:fairlocked") == 0 {
		t.Errorf("no task joined the lock's queue: the lock was never contended")
	}
}

// A turn started by a worker that died before it woke the task (parked in
// asynq's retry set, its fallback a minute away) is brought back by a live
// server's kick within seconds of its start, and runs once.
func TestFairLostWakeIsWokenAgain(t *testing.T) {
	t.Parallel()
	ran := make(chan string, 2)
	spec := Spec{
		Type:   "t:fair",
		Decode: func(b []byte) (any, error) { return string(b), nil },
		Fair:   func(any) (string, int) { return "A", 1 },
		Run:    func(_ context.Context, job Job, _ any) error { ran <- job.ID; return nil },
	}
	e := newEnv(t, testConfig(), spec)
	ctx := context.Background()
	// The dead worker's part, the queue paused so that the live server
	// takes nothing meanwhile: it saw the task, parked it, started its
	// turn, and died before the wake.
	if err := e.insp.PauseQueue("default"); err != nil {
		t.Fatal(err)
	}
	e.enqueue("t:fair", "lost", []byte("lost"), asynq.MaxRetry(5))
	scope := lock.FairScope("default", "t:fair")
	if _, err := e.locker.Fair(ctx, scope, lock.FairAsk{Seen: []lock.FairTask{{ID: "lost", Tenant: "A", Weight: 1}}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if moved, err := asynqstore.New(e.admin).Park(ctx, "default", []string{"lost"}, time.Now().Add(time.Minute)); err != nil || len(moved) != 1 {
		t.Fatalf("park: %v, %v", moved, err)
	}
	started := time.Now()
	if f, err := e.locker.Fair(ctx, scope, lock.FairAsk{Release: 1, TTL: time.Minute}); err != nil || len(f.Started) != 1 {
		t.Fatalf("start: %+v, %v", f, err)
	}
	if err := e.insp.UnpauseQueue("default"); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-ran:
		t.Logf("%s ran %v after its start", id, time.Since(started).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the started task did not run within 10s (its fallback is a minute): state %s", e.info("lost").State)
	}
	e.waitState("lost", asynq.TaskStateCompleted, 10*time.Second)
	select {
	case id := <-ran:
		t.Fatalf("%s ran twice", id)
	default:
	}
}
