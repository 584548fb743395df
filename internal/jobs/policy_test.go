package jobs

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// exclusive is a handler body that records how many runs overlap.
type exclusive struct {
	active, maxActive, runs, cut atomic.Int32
}

func (x *exclusive) run(ctx context.Context, work time.Duration) error {
	n := x.active.Add(1)
	defer x.active.Add(-1)
	for m := x.maxActive.Load(); n > m && !x.maxActive.CompareAndSwap(m, n); m = x.maxActive.Load() {
	}
	x.runs.Add(1)
	select {
	case <-time.After(work):
		return nil
	case <-ctx.Done():
		x.cut.Add(1)
		return ctx.Err()
	}
}

// policySpec is a handler on the hot resource "hot" with policy p.
func policySpec(x *exclusive, work time.Duration, p Contention, wait time.Duration) Spec {
	s := lockedSpec("t:hot", "hot", func(ctx context.Context, _ Job) error { return x.run(ctx, work) })
	s.Contention, s.ContentionWait = p, wait
	return s
}

// onTwoWorkers runs spec on two workers sharing one Redis.
func onTwoWorkers(t *testing.T, spec Spec) *env {
	t.Helper()
	e := newEnv(t, testConfig(), spec)
	e.addWorker(testConfig(), spec)
	return e
}

// runHot enqueues n tasks on the hot resource (ids prefix0, prefix1, ...)
// and waits for each to complete; it returns their infos in that order.
func runHot(e *env, prefix string, n int, timeout time.Duration, opts ...asynq.Option) []*asynq.TaskInfo {
	for i := range n {
		e.enqueue("t:hot", fmt.Sprintf("%s%d", prefix, i), nil, opts...)
	}
	infos := make([]*asynq.TaskInfo, n)
	for i := range n {
		infos[i] = e.waitState(fmt.Sprintf("%s%d", prefix, i), asynq.TaskStateCompleted, timeout)
	}
	return infos
}

// Skip, on two workers: duplicates that find the resource busy complete
// without running; the handler never runs twice at once and the first run
// finishes.
func TestSkipPolicyOnTwoWorkers(t *testing.T) {
	t.Parallel()
	x := &exclusive{}
	e := onTwoWorkers(t, policySpec(x, 500*time.Millisecond, Skip, 0))
	const n = 10
	skipped := 0
	for _, info := range runHot(e, "s", n, 20*time.Second) {
		if string(info.Result) == ResultSkipped {
			skipped++
		}
	}
	if x.maxActive.Load() != 1 || x.cut.Load() != 0 {
		t.Fatalf("%d runs at once at most, %d cut short; want 1 and 0", x.maxActive.Load(), x.cut.Load())
	}
	if runs := int(x.runs.Load()); runs < 1 || runs+skipped != n || skipped == 0 {
		t.Fatalf("%d runs and %d skips for %d tasks", runs, skipped, n)
	}
	e.wantProcessed("t:hot", ResultSkipped, float64(skipped))
}

// Wait, on two workers: a task waits in the worker for a lock that frees
// within the bound, and is not requeued; with a bound shorter than the hold,
// it is requeued after the wait.
func TestWaitPolicyOnTwoWorkers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		hold, bound    time.Duration
		wantRequeueErr bool
	}{
		{"frees within the bound", 300 * time.Millisecond, 5 * time.Second, false},
		{"still busy after the bound", 1500 * time.Millisecond, 100 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			x := &exclusive{}
			started := make(chan struct{}, 2)
			spec := policySpec(x, c.hold, Wait, c.bound)
			run := spec.Run
			spec.Run = func(ctx context.Context, job Job, p any) error {
				started <- struct{}{}
				return run(ctx, job, p)
			}
			e := onTwoWorkers(t, spec)
			e.enqueue("t:hot", "first", nil)
			<-started
			e.enqueue("t:hot", "second", nil)
			for _, id := range []string{"first", "second"} {
				info := e.waitState(id, asynq.TaskStateCompleted, 20*time.Second)
				if info.Retried != 0 {
					t.Errorf("%s: retried %d, want 0", id, info.Retried)
				}
				if requeued := strings.Contains(info.LastErr, "busy"); id == "second" && requeued != c.wantRequeueErr {
					t.Errorf("second: requeued %t (last error %q), want %t", requeued, info.LastErr, c.wantRequeueErr)
				}
			}
			if x.maxActive.Load() != 1 || x.runs.Load() != 2 {
				t.Fatalf("%d runs, %d at once at most; want 2 and 1", x.runs.Load(), x.maxActive.Load())
			}
			if e.contended("t:hot") < 1 {
				t.Fatal("no contention counted")
			}
		})
	}
}

// Requeue, on two workers: every task on the hot resource runs once, one at
// a time, and none used a retry.
func TestRequeuePolicyOnTwoWorkers(t *testing.T) {
	t.Parallel()
	x := &exclusive{}
	e := onTwoWorkers(t, policySpec(x, 20*time.Millisecond, Requeue, 0))
	const n = 20
	for i, info := range runHot(e, "r", n, 60*time.Second, asynq.MaxRetry(1)) {
		if info.Retried != 0 {
			t.Errorf("r%d: retried %d, want 0", i, info.Retried)
		}
	}
	if x.maxActive.Load() != 1 || x.runs.Load() != n {
		t.Fatalf("%d runs, %d at once at most; want %d and 1", x.runs.Load(), x.maxActive.Load(), n)
	}
	if e.contended("t:hot") == 0 {
		t.Fatal("no contention: the test did not exercise requeue")
	}
}
