package jobs

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// startLog records the start of each run of a handler.
type startLog struct {
	mu       sync.Mutex
	starts   []time.Time
	admitted []time.Time // the runs' admissions, where the run was admitted (Job.Admitted)
	lag      time.Duration
	runs     map[string]int
}

func (l *startLog) add(job Job) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	id := job.ID
	l.starts = append(l.starts, now)
	if !job.Admitted.IsZero() {
		l.admitted = append(l.admitted, job.Admitted)
		l.lag = max(l.lag, now.Sub(job.Admitted))
	}
	if l.runs == nil {
		l.runs = map[string]int{}
	}
	l.runs[id]++
}

// overBound returns a window in which more than N·(w+slack)/Per + Burst of
// starts fall (G11 with slack 0), or "".
func overBound(starts []time.Time, r lock.Rate, slack time.Duration) string {
	s := slices.Clone(starts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	burst := cmpOr(r.Burst, r.N)
	for i := range s {
		for j := i + burst; j < len(s); j++ {
			w := s[j].Sub(s[i]) + slack
			if count := j - i + 1; int64(count-burst)*int64(r.Per) > int64(r.N)*int64(w) {
				return fmt.Sprintf("%d starts within %v", count, w)
			}
		}
	}
	return ""
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// ratedSpec is a handler of typ limited to r on one key, recording its
// starts in log; with resource, under that lock too.
func ratedSpec(typ, resource string, r lock.Rate, log *startLog) Spec {
	s := Spec{
		Type:   typ,
		Decode: func(b []byte) (any, error) { return string(b), nil },
		Rate:   func(any) (string, lock.Rate) { return "rate:" + typ, r },
		Run: func(_ context.Context, job Job, _ any) error {
			log.add(job)
			time.Sleep(20 * time.Millisecond)
			return nil
		},
	}
	if resource != "" {
		s.Resource = func(any) string { return resource }
	}
	return s
}

// G11 for jobs: tasks over their rate are delayed to their turn, on two
// servers, never failed and never counted as an attempt; every task runs
// once and the starts stay within the bound. A task under a lock (or one of
// 3 permits) as well has its rate decided with its lock (one admission,
// Locker.Take with a TaskRate), or as a hand-off gives it the lock: its
// start follows its admission at once, never by a wait for the lock, so its
// starts too are held to the bound over w + the longest lag measured from
// an admission to its start. The admissions are held to the bound exactly.
func TestRateLimitedTasksAreDelayedNotFailed(t *testing.T) {
	t.Parallel()
	r := lock.Rate{N: 10, Per: time.Second, Burst: 2}
	for _, c := range []struct {
		resource string
		limit    int
	}{{"", 0}, {"res", 0}, {"res", 3}} {
		resource := c.resource
		t.Run(fmt.Sprintf("lock=%s/limit=%d", resource, c.limit), func(t *testing.T) {
			t.Parallel()
			var log startLog
			spec := ratedSpec("t:rated", resource, r, &log)
			spec.Limit = c.limit
			e := newEnv(t, testConfig(), spec)
			e.addWorker(testConfig(), spec)
			const n = 20
			for i := range n {
				e.enqueueID("t:rated", fmt.Sprintf("r%d", i), asynq.MaxRetry(1), asynq.Retention(time.Hour))
			}
			for i := range n {
				info := e.waitState(fmt.Sprintf("r%d", i), asynq.TaskStateCompleted, 30*time.Second)
				if info.Retried != 0 {
					t.Errorf("task %s: retried %d, want 0 (a delay is no attempt)", info.ID, info.Retried)
				}
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			for id, runs := range log.runs {
				if runs != 1 {
					t.Errorf("task %s ran %d times", id, runs)
				}
			}
			if w := overBound(log.admitted, r, 0); w != "" {
				t.Fatalf("admissions: %s: over %d/%v + burst %d", w, r.N, r.Per, r.Burst)
			}
			// a start follows its admission by the lag measured (no lock), or
			// by its wait for the lock too
			if w := overBound(log.starts, r, log.lag); w != "" {
				t.Fatalf("starts: %s: over %d/%v + burst %d (slack %v, the longest lag)", w, r.N, r.Per, r.Burst, log.lag)
			}
			limited := testutil.ToFloat64(e.metrics.RateLimited.WithLabelValues("t:rated"))
			if limited == 0 {
				t.Fatal("lockstep_rate_limited_total is 0: no task was over its rate")
			}
			s := slices.Clone(log.starts)
			slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
			// Under-grant: a delayed task is brought back at its turn, not at
			// asynq's next whole second (which would admit about one a second).
			ideal := time.Duration(float64(n-r.Burst) / float64(r.N) * float64(time.Second))
			if span := s[len(s)-1].Sub(s[0]); span > ideal+time.Second {
				t.Fatalf("%d tasks took %v to start, want about %v: delayed tasks miss their turns", n, span, ideal)
			}
			t.Logf("%d tasks started over %v (at least %.1fs at %d/%v, burst %d); %v delays; %d admissions seen by runs, the latest run %v after its admission",
				len(s), s[len(s)-1].Sub(s[0]).Round(time.Millisecond), float64(n-r.Burst)/float64(r.N), r.N, r.Per, r.Burst, limited,
				len(log.admitted), log.lag.Round(time.Microsecond))
		})
	}
}

// A task with no retries left cannot go back to asynq (it would be
// archived): over its rate, it waits its turn in the worker. Its start
// follows its admission at once, so only the admissions are held to the
// bound exactly (a handler's clock read lags the server's decision).
func TestRateLimitedWithNoRetriesLeftWaits(t *testing.T) {
	t.Parallel()
	r := lock.Rate{N: 5, Per: time.Second, Burst: 1}
	var log startLog
	e := newEnv(t, testConfig(), ratedSpec("t:rated", "", r, &log))
	for i := range 4 {
		e.enqueueID("t:rated", fmt.Sprintf("z%d", i), asynq.MaxRetry(0), asynq.Retention(time.Hour))
	}
	for i := range 4 {
		e.waitState(fmt.Sprintf("z%d", i), asynq.TaskStateCompleted, 30*time.Second)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.admitted) != 4 {
		t.Fatalf("%d runs were admitted by the rate, want 4", len(log.admitted))
	}
	if w := overBound(log.admitted, r, 0); w != "" {
		t.Fatalf("%s: over the bound", w)
	}
	if info := e.info("z3"); info.Retried != 0 {
		t.Fatalf("retried %d", info.Retried)
	}
	if got := testutil.ToFloat64(e.metrics.RateLimited.WithLabelValues("t:rated")); got < 3 {
		t.Fatalf("lockstep_rate_limited_total = %v, want at least 3 (every task but the first waited)", got)
	}
}

// deliveries counts the times each task reached its handler's decode, that
// is, was dequeued by a worker (the payload is the task id: enqueueID).
type deliveries struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *deliveries) wrap(s Spec) Spec {
	decode := s.Decode
	s.Decode = func(b []byte) (any, error) {
		d.mu.Lock()
		if d.n == nil {
			d.n = map[string]int{}
		}
		d.n[string(b)]++
		d.mu.Unlock()
		return decode(b)
	}
	return s
}

// Issue 39: a task over its rate is dequeued at most twice, once to be
// admitted or given its time and once to run. 20 tasks of one key (10 a
// second, burst 2) on two servers; each task's dequeues are counted at its
// decode, and asynq's Inspector says each completed with Retried 0. Under a
// lock as well (one admission), a task either takes its turn with its lock
// kept for it, or parks for its lock without spending a turn and is run by
// the hand-off (its second decode), waiting there for its turn.
func TestOverLimitTaskDequeuedAtMostTwice(t *testing.T) {
	t.Parallel()
	for _, resource := range []string{"", "res"} {
		t.Run("lock="+resource, func(t *testing.T) {
			t.Parallel()
			r := lock.Rate{N: 10, Per: time.Second, Burst: 2}
			var log startLog
			var d deliveries
			spec := d.wrap(ratedSpec("t:rated", resource, r, &log))
			e := newEnv(t, testConfig(), spec)
			e.addWorker(testConfig(), spec)
			const n = 20
			for i := range n {
				e.enqueueID("t:rated", fmt.Sprintf("r%d", i), asynq.MaxRetry(1), asynq.Retention(time.Hour))
			}
			for i := range n {
				if info := e.waitState(fmt.Sprintf("r%d", i), asynq.TaskStateCompleted, 30*time.Second); info.Retried != 0 {
					t.Errorf("task %s: retried %d, want 0", info.ID, info.Retried)
				}
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			var counts []int
			over := 0
			for i := range n {
				c := d.n[fmt.Sprintf("r%d", i)]
				counts = append(counts, c)
				if c > 2 {
					over++
				}
			}
			t.Logf("dequeues per task: %v", counts)
			if over > 0 {
				t.Fatalf("%d of %d tasks dequeued more than twice: %v", over, n, counts)
			}
		})
	}
}
