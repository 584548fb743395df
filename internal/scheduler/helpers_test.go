package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

// testConfig is a scheduler configuration with short leases for tests.
func testConfig(skew, lease time.Duration, schedules ...config.Schedule) *config.SchedulerConfig {
	c := config.DefaultScheduler()
	c.Scheduler.MaxClockSkew = skew
	c.Scheduler.TickLockTTL = lease
	c.Scheduler.TaskRetention = time.Hour
	c.Schedules = schedules
	return c
}

func sched(name, cron string, catchUp config.CatchUp) config.Schedule {
	return config.Schedule{
		Name: name, Cron: cron, Timezone: "UTC", Task: "test:tick", Payload: json.RawMessage(`{"n":1}`),
		Queue: "default", MaxRetry: 3, CatchUp: catchUp,
	}
}

// numberedScheds is n schedules named by format (with each one's number) on cron,
// catch-up skip.
func numberedScheds(n int, format, cron string) []config.Schedule {
	out := make([]config.Schedule, n)
	for i := range out {
		out[i] = sched(fmt.Sprintf(format, i), cron, config.CatchUpSkip)
	}
	return out
}

// waitLive waits until each of reps sees all of them live.
func waitLive(t *testing.T, reps ...*Scheduler) {
	t.Helper()
	redistest.WaitFor(t, 5*time.Second, fmt.Sprintf("every replica sees %d live", len(reps)), func() bool {
		for _, r := range reps {
			if l := r.replicas.Load(); l == nil || len(*l) != len(reps) {
				return false
			}
		}
		return true
	})
}

// threeLive starts replicas r0, r1 and r2 of c on srv, all recording to one
// new recorder, and waits until each sees the three live.
func threeLive(t *testing.T, srv *redistest.Server, c *config.SchedulerConfig) ([]*Scheduler, *recorder) {
	t.Helper()
	rec := newRecorder()
	var reps []*Scheduler
	for _, id := range []string{"r0", "r1", "r2"} {
		reps = append(reps, replica(t, srv, c, rec, id))
	}
	waitLive(t, reps...)
	return reps, rec
}

// replica starts a scheduler with its own Redis client, as a separate
// process would have, and stops it when the test ends.
func replica(t testing.TB, srv *redistest.Server, c *config.SchedulerConfig, rec *recorder, id string, opts ...Option) *Scheduler {
	t.Helper()
	return replicaOn(t, srv.Client(), c, rec, id, opts...)
}

// replicaOn is replica with the client given.
func replicaOn(t testing.TB, client redis.UniversalClient, c *config.SchedulerConfig, rec *recorder, id string, opts ...Option) *Scheduler {
	t.Helper()
	h := hooks{}
	if rec != nil {
		h.event = rec.add
	}
	opts = append([]Option{WithReplicaID(id), withHooks(h)}, opts...)
	s, err := New(client, c, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	return s
}

// stop stops s gracefully, as SIGTERM would; t.Context is over by cleanup.
func stop(t testing.TB, s *Scheduler) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// recorder collects the events of any number of replicas and lets a test
// wait for a condition on them.
type recorder struct {
	mu      sync.Mutex
	events  []event
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) add(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// wait returns once ok holds for the events so far, and fails the test if
// that takes longer than timeout.
func (r *recorder) wait(t *testing.T, timeout time.Duration, what string, ok func([]event) bool) []event {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		evs, changed := slices.Clone(r.events), r.changed
		r.mu.Unlock()
		if ok(evs) {
			return evs
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s; events:\n%s", timeout, what, describeEvents(evs))
		}
	}
}

// waitTick waits until every replica named has reported on the tick.
func (r *recorder) waitTick(t *testing.T, timeout time.Duration, schedule string, tick time.Time, replicas ...string) {
	t.Helper()
	r.wait(t, timeout, fmt.Sprintf("%s tick %v on %v", schedule, tick.UTC(), replicas), func(evs []event) bool {
		seen := map[string]bool{}
		for _, e := range evs {
			if e.Schedule == schedule && e.Tick.Equal(tick) && e.Result != ResultMissed {
				seen[e.Replica] = true
			}
		}
		for _, id := range replicas {
			if !seen[id] {
				return false
			}
		}
		return true
	})
}

// waitTicks is waitTick for each tick of spec from from to to, both included.
func (r *recorder) waitTicks(t *testing.T, timeout time.Duration, schedule string, spec Spec, from, to time.Time, replicas ...string) {
	t.Helper()
	for tick := from; !tick.After(to); tick = spec.Next(tick) {
		r.waitTick(t, timeout, schedule, tick, replicas...)
	}
}

func describeEvents(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s %s %s %s n=%d\n", e.Replica, e.Schedule, e.Tick.UTC().Format(time.RFC3339), e.Result, e.Count)
	}
	return b.String()
}

// countResult sums the events of one result, for one schedule.
func countResult(evs []event, schedule, result string) int {
	n := 0
	for _, e := range evs {
		if e.Schedule == schedule && e.Result == result {
			n += max(e.Count, 1)
		}
	}
	return n
}

// taskTicks reads every task of schedule in queue "default" with asynq's
// Inspector and returns their ticks, sorted. It fails the test on a task id
// that is not "<schedule>:<unix>".
func taskTicks(t *testing.T, c redis.UniversalClient, schedule string) []int64 {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(c)
	var out []int64
	for page := 1; page < 1000; page++ {
		tasks, err := insp.ListPendingTasks("default", asynq.PageSize(500), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			break // nothing enqueued yet
		}
		if err != nil {
			t.Fatalf("ListPendingTasks: %v", err)
		}
		for _, ti := range tasks {
			if strings.Contains(ti.ID, ":trigger:") {
				continue // triggered by hand, not a tick
			}
			name, unix, ok := strings.Cut(ti.ID, ":")
			if name != schedule {
				continue
			}
			u, err := strconv.ParseInt(unix, 10, 64)
			if !ok || err != nil {
				t.Fatalf("task id %q is not <schedule>:<unix>", ti.ID)
			}
			if ti.Type != "test:tick" || string(ti.Payload) != `{"n":1}` {
				t.Errorf("task %s: type %q payload %s", ti.ID, ti.Type, ti.Payload)
			}
			out = append(out, u)
		}
		if len(tasks) < 500 {
			break
		}
	}
	slices.Sort(out)
	return out
}

// assertExactlyOnce checks that every tick of spec in [from, to] has exactly
// one task, and that there is no task for another time before to.
func assertExactlyOnce(t *testing.T, c redis.UniversalClient, schedule string, spec Spec, from, to time.Time) {
	t.Helper()
	want, _, _ := between(spec, from.Add(-time.Second), to, 1<<20)
	got := taskTicks(t, c, schedule)
	count := map[int64]int{}
	for _, u := range got {
		count[u]++
	}
	for _, w := range want {
		if n := count[w.Unix()]; n != 1 {
			t.Errorf("tick %v (%s): %d tasks, want 1", w.UTC(), TaskID(schedule, w), n)
		}
	}
	wanted := map[int64]bool{}
	for _, w := range want {
		wanted[w.Unix()] = true
	}
	for _, u := range got {
		if u <= to.Unix() && u >= from.Unix() && !wanted[u] {
			t.Errorf("task %s:%d is not a tick of %s", schedule, u, spec)
		}
	}
	if len(want) == 0 {
		t.Errorf("no ticks in [%v, %v]", from, to)
	}
}

func unixTimes(ts ...time.Time) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.Unix()
	}
	return out
}

// pendingTicks returns the ticks pending in k's state, sorted.
func pendingTicks(t *testing.T, c redis.UniversalClient, k keys) []int64 {
	t.Helper()
	state, err := c.HGetAll(t.Context(), k.state).Result()
	if err != nil {
		t.Fatalf("read %s: %v", k.state, err)
	}
	var out []int64
	for f, v := range state {
		if u, _, _, ok := parsePending(f, v); ok {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}
