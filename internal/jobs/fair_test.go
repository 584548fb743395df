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
