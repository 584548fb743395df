package jobs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
)

// permits records what a resource's holders did: how many ran at once, and
// each permit's holder and fences in the order they began.
type permits struct {
	mu        sync.Mutex
	active    int
	maxActive int
	holder    map[int]string
	fences    map[int][]int64
	errs      []string
}

func (p *permits) run(ctx context.Context, job Job, hold time.Duration) error {
	p.mu.Lock()
	p.active++
	p.maxActive = max(p.maxActive, p.active)
	if h, ok := p.holder[job.Permit]; ok {
		p.errs = append(p.errs, fmt.Sprintf("permit %d held by %s and %s at once", job.Permit, h, job.ID))
	}
	if f := p.fences[job.Permit]; len(f) > 0 && job.Fence <= f[len(f)-1] {
		p.errs = append(p.errs, fmt.Sprintf("permit %d: fence %d after %d", job.Permit, job.Fence, f[len(f)-1]))
	}
	p.holder[job.Permit] = job.ID
	p.fences[job.Permit] = append(p.fences[job.Permit], job.Fence)
	p.mu.Unlock()
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	p.mu.Lock()
	delete(p.holder, job.Permit)
	p.active--
	p.mu.Unlock()
	return ctx.Err()
}

// TestLimitRunsAtMostNTasksAtOnceEachOnItsPermit: a type with Limit(3) on
// two workers with 8 slots runs 3 of its tasks at once, never more, never
// two on one permit, with each permit's fences increasing; busy tasks wait
// their turn without using retries, and each Wait or Requeue policy gets the
// permits handed on.
func TestLimitRunsAtMostNTasksAtOnceEachOnItsPermit(t *testing.T) {
	t.Parallel()
	for _, policy := range []Contention{Requeue, Wait} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			t.Parallel()
			p := &permits{holder: map[int]string{}, fences: map[int][]int64{}}
			spec := lockedSpec("t:tenant", "lock:tenant:a", func(ctx context.Context, job Job) error {
				return p.run(ctx, job, 100*time.Millisecond)
			})
			spec.Limit, spec.Contention, spec.ContentionWait = 3, policy, 30*time.Second
			cfg := testConfig()
			e := newEnv(t, cfg, spec)
			e.addWorker(cfg, spec)
			const n = 12
			for i := range n {
				e.enqueue("t:tenant", fmt.Sprintf("t%02d", i), nil)
			}
			for i := range n {
				if info := e.waitState(fmt.Sprintf("t%02d", i), asynq.TaskStateCompleted, 30*time.Second); info.Retried != 0 {
					t.Errorf("task %s retried %d times: contention used its retries", info.ID, info.Retried)
				}
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, err := range p.errs {
				t.Error(err)
			}
			if p.maxActive != 3 {
				t.Errorf("%d tasks ran at once at most, want the limit, 3", p.maxActive)
			}
			if len(p.fences) != 3 {
				t.Errorf("permits used: %v, want 0, 1 and 2", p.fences)
			}
			e.wantProcessed("t:tenant", ResultSuccess, n)
			// Every task that found the 3 permits held waited in the queue
			// for one: at least the 9 beyond the first 3.
			if c := histogramCount(t, e.metrics.PermitWait); c < n-3 {
				t.Errorf("lockstep_permit_wait_seconds has %d observations, want at least %d", c, n-3)
			}
		})
	}
}

func TestLimitNeedsALockAndAtLeastOne(t *testing.T) {
	t.Parallel()
	s := lockedSpec("t:x", "x", func(context.Context, Job) error { return nil })
	s.Limit = -1
	if _, err := NewRegistry([]Spec{s}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
	s.Limit, s.Resource = 2, nil
	if _, err := NewRegistry([]Spec{s}); err == nil {
		t.Fatal("a limit without a lock was accepted")
	}
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v", err)
	}
	return mfs[0].GetMetric()[0].GetHistogram().GetSampleCount()
}
