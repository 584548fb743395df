package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// liveVersion returns the definition version of the running loop of name.
func (s *Scheduler) liveVersion(name string) (string, bool) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	l, ok := s.live[name]
	if !ok {
		return "", false
	}
	return l.e.version + "|" + l.e.spec.String(), true
}

// waitAll waits until cond holds on every replica, within 1s: the bound
// that run-time changes promise.
func waitAll(t *testing.T, what string, reps []*Scheduler, cond func(*Scheduler) bool) {
	t.Helper()
	redistest.WaitFor(t, time.Second, what+" on every replica", func() bool {
		for _, r := range reps {
			if !cond(r) {
				return false
			}
		}
		return true
	})
}

func runtimeSched(name, cron string) config.Schedule {
	s := config.NewSchedule()
	s.Name, s.Cron, s.Task, s.Payload = name, cron, "test:tick", json.RawMessage(`{"n":1}`)
	return s
}

// Add, change, pause, resume and remove a schedule while 3 replicas run:
// each change is running on every replica within 1s, each tick is enqueued
// once, a bad change is refused with the config's message and changes nothing.
func TestRuntimeSchedulesOnThreeReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	reps, rec := threeLive(t, srv, testConfig(0, 2*time.Second, sched("from-file", "@every 1h", config.CatchUpSkip)))
	st := NewStore(srv.Client(), "")

	// Add.
	if err := st.Add(ctx, runtimeSched("rt", "* * * * * *")); err != nil {
		t.Fatalf("Add: %v", err)
	}
	added := time.Now()
	waitAll(t, "rt running", reps, func(s *Scheduler) bool { _, ok := s.liveVersion("rt"); return ok })
	if err := st.Add(ctx, runtimeSched("rt", "* * * * * *")); !errors.Is(err, ErrExists) {
		t.Errorf("second Add = %v, want ErrExists", err)
	}
	if err := st.Add(ctx, runtimeSched("from-file", "* * * * * *")); !errors.Is(err, ErrFileSchedule) {
		t.Errorf("Add of a file schedule's name = %v, want ErrFileSchedule", err)
	}
	first := time.Unix(added.Unix()+1, 0)
	rec.waitTick(t, 5*time.Second, "rt", first.Add(time.Second), "r0", "r1", "r2")

	// A bad change is refused with the config's message and nothing applied.
	before, _ := srv.Client().HGet(ctx, storeKeysFor("lockstep:").defs, "rt").Result()
	bad := runtimeSched("rt", "61 * * * * *")
	bad.CatchUp = "sometimes"
	err := st.Update(ctx, bad)
	for _, want := range []string{
		`schedule (rt).cron: invalid cron expression "61 * * * * *"`,
		`schedule (rt).catch_up: must be skip, once or all, got "sometimes"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad Update = %v, want %q", err, want)
		}
	}
	if _, ok := errors.AsType[*config.Error](err); !ok {
		t.Errorf("bad Update: %T is not a *config.Error", err)
	}
	if after, _ := srv.Client().HGet(ctx, storeKeysFor("lockstep:").defs, "rt").Result(); after != before {
		t.Errorf("a refused update changed the stored definition:\n%s\n%s", before, after)
	}

	// Pause: no replica runs it within 1s; resume after 2s of ticks (skip:
	// they are dropped, not replayed).
	if changed, err := st.SetPaused(ctx, "rt", true, false); err != nil || !changed {
		t.Fatalf("pause = %v, %v", changed, err)
	}
	paused := time.Now()
	waitAll(t, "rt stopped", reps, func(s *Scheduler) bool { _, ok := s.liveVersion("rt"); return !ok })
	if changed, err := st.SetPaused(ctx, "rt", true, false); err != nil || changed {
		t.Errorf("second pause = %v, %v; want false, nil", changed, err)
	}
	time.Sleep(3 * time.Second) // the pause itself: ticks that come due meanwhile
	if _, err := st.SetPaused(ctx, "rt", false, false); err != nil {
		t.Fatalf("resume: %v", err)
	}
	resumed := time.Now()
	waitAll(t, "rt resumed", reps, func(s *Scheduler) bool { _, ok := s.liveVersion("rt"); return ok })

	// Update the cron: every 2s from now on, no old tick replayed.
	v0, _ := reps[0].liveVersion("rt")
	if err := st.Update(ctx, runtimeSched("rt", "*/2 * * * * *")); err != nil {
		t.Fatalf("Update: %v", err)
	}
	updated := time.Now()
	waitAll(t, "rt changed", reps, func(s *Scheduler) bool {
		v, ok := s.liveVersion("rt")
		return ok && v != v0 && strings.HasSuffix(v, "|*/2 * * * * *")
	})
	next := time.Unix(updated.Unix()+1, 0)
	if next.Unix()%2 == 1 {
		next = next.Add(time.Second)
	}
	rec.waitTick(t, 5*time.Second, "rt", next.Add(2*time.Second), "r0", "r1", "r2")

	// Trigger: one task with its own id.
	id, err := st.Trigger(ctx, "rt", nil)
	if err != nil || !strings.HasPrefix(id, "rt:trigger:") {
		t.Fatalf("Trigger = %q, %v", id, err)
	}
	if _, err := asynq.NewInspectorFromRedisClient(srv.Client()).GetTaskInfo("default", id); err != nil {
		t.Errorf("triggered task %s: %v", id, err)
	}

	// Remove.
	if err := st.Remove(ctx, "rt"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	removed := time.Now()
	waitAll(t, "rt removed", reps, func(s *Scheduler) bool { _, ok := s.liveVersion("rt"); return !ok })
	if err := st.Remove(ctx, "rt"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove = %v, want ErrNotFound", err)
	}
	for _, r := range reps {
		if _, ok := r.liveVersion("from-file"); !ok {
			t.Errorf("%s: the file schedule stopped", r.id)
		}
	}

	// Every tick enqueued exactly once: none while paused, none of the old
	// spec after the update, none after the removal (a replica may act on
	// a change up to the 1s bound late).
	enq := map[int64]int{}
	for _, e := range rec.all() {
		if e.Schedule != "rt" {
			continue
		}
		switch e.Result {
		case ResultEnqueued, ResultCaughtUp:
			enq[e.Tick.Unix()]++
		case ResultDuplicate:
			t.Errorf("tick %v enqueued twice (duplicate on %s)", e.Tick, e.Replica)
		}
	}
	for u, n := range enq {
		tick := time.Unix(u, 0)
		switch {
		case n != 1:
			t.Errorf("tick %v: enqueued %d times", tick, n)
		case tick.Before(first):
			t.Errorf("tick %v: before the schedule was added (%v)", tick, added)
		case tick.After(paused.Add(time.Second)) && tick.Before(resumed.Add(-claimMargin)):
			// Ticks within max_clock_skew + 1s of the resume are on time.
			t.Errorf("tick %v: enqueued while paused (%v..%v)", tick, paused, resumed)
		case tick.After(updated.Add(time.Second)) && u%2 == 1:
			t.Errorf("tick %v: of the old spec after the update at %v", tick, updated)
		case tick.After(removed.Add(time.Second)):
			t.Errorf("tick %v: after the removal at %v", tick, removed)
		}
	}
	for u := first.Unix(); u <= paused.Unix()-1; u++ {
		if enq[u] != 1 {
			t.Errorf("tick %v before the pause: enqueued %d times, want 1", time.Unix(u, 0), enq[u])
		}
	}
	// The history: the trigger, done ticks with their leader and task id, the pause's skip.
	ticks, err := st.Ticks(ctx, "rt", historyLen)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for _, tk := range ticks {
		states[tk.State]++
		switch {
		case tk.State == TickDone && tk.Leader == "trigger" && tk.TaskID != id:
			t.Errorf("trigger record %+v, want task id %s", tk, id)
		case tk.State == TickDone && tk.Leader != "trigger" && (tk.TaskID != TaskID("rt", tk.Tick) || !strings.HasPrefix(tk.Leader, "r")):
			t.Errorf("done record %+v", tk)
		}
	}
	if states[TickDone] < 5 || states[TickSkipped] < 1 {
		t.Errorf("history states %v, want several done and a skip", states)
	}
	// The pause's ticks, dropped at the resume (catch_up skip), are the
	// operator's choice: counted skipped_paused, not missed.
	if n := countResult(rec.all(), "rt", ResultSkippedPaused); n == 0 {
		t.Errorf("no tick of the pause counted skipped_paused (catch_up skip)")
	}
	if n := countResult(rec.all(), "rt", ResultMissed); n != 0 {
		t.Errorf("%d ticks counted missed, want none: the only ticks dropped were the pause's", n)
	}
}

// Many run-time schedules: the tick series stay bounded (the first
// maxLabeledRuntime by name, the rest under OtherSchedules), the schedules
// gauge counts them by source and state, and removed schedules' series go.
func TestRuntimeSeriesAreBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	m := metrics.New(prometheus.NewRegistry())
	c := testConfig(0, 2*time.Second, sched("from-file", "@every 1h", config.CatchUpSkip))
	replica(t, srv, c, nil, "r0", WithMetrics(m))
	st := NewStore(srv.Client(), "")
	const n = maxLabeledRuntime + 50
	for i := range n {
		if err := st.Add(ctx, runtimeSched(fmt.Sprintf("rt-%03d", i), "@every 1h")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.SetPaused(ctx, "from-file", true, false); err != nil {
		t.Fatal(err)
	}
	gauge := func(src, state string) float64 {
		return testutil.ToFloat64(m.SchedulerSchedules.WithLabelValues(src, state))
	}
	redistest.WaitFor(t, 2*time.Second, "all schedules applied", func() bool {
		return gauge(SourceRuntime, "running") == n && gauge(SourceFile, "paused") == 1
	})
	series := func() int { return testutil.CollectAndCount(m.SchedulerTicks) }
	// 100 named + _other, 5 results each; the paused file schedule has none.
	if got, want := series(), (maxLabeledRuntime+1)*len(tickResults); got != want {
		t.Errorf("%d tick series, want %d", got, want)
	}
	for i := range n {
		if err := st.Remove(ctx, fmt.Sprintf("rt-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	redistest.WaitFor(t, 2*time.Second, "all removed", func() bool { return gauge(SourceRuntime, "running") == 0 })
	if got, want := series(), len(tickResults); got != want { // _other remains
		t.Errorf("after removal: %d tick series, want %d", got, want)
	}
}

// A changed cron never replays old ticks, even with catch_up all: after a
// pause, an update of the spec and a resume, only the pause's ticks after
// the update are caught up, none of the new spec before it.
func TestChangedSpecDoesNotReplay(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	rec := newRecorder()
	replica(t, srv, testConfig(0, 2*time.Second), rec, "r0")
	st := NewStore(srv.Client(), "")
	s := runtimeSched("rt", "*/2 * * * * *")
	s.CatchUp = config.CatchUpAll
	if err := st.Add(ctx, s); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 5*time.Second, "a tick of rt", func(evs []event) bool { return countResult(evs, "rt", ResultEnqueued) > 0 })
	if _, err := st.SetPaused(ctx, "rt", true, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // ticks of the old spec come due while paused
	s.Cron = "* * * * * *"
	if err := st.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	updated := time.Now()
	time.Sleep(2 * time.Second) // and ticks of the new spec, after the update
	if _, err := st.SetPaused(ctx, "rt", false, false); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	rec.wait(t, 5*time.Second, "rt ticking again", func(evs []event) bool {
		for _, e := range evs {
			if e.Schedule == "rt" && e.Result == ResultEnqueued && e.Tick.After(resumed) {
				return true
			}
		}
		return false
	})
	caught := 0
	for _, e := range rec.all() {
		if e.Schedule != "rt" || e.Result != ResultCaughtUp && e.Result != ResultEnqueued {
			continue
		}
		if e.Result == ResultCaughtUp {
			caught++
		}
		if e.Tick.Unix() <= updated.Unix() && e.Tick.After(updated.Add(-3*time.Second)) {
			t.Errorf("tick %v (%s) of the time before the update at %v was enqueued", e.Tick, e.Result, updated)
		}
	}
	if caught == 0 {
		t.Errorf("no tick after the update caught up on resume (catch_up all)")
	}
}
