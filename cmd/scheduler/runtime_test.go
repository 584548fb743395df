package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/schedules"
)

// applyBound is how soon every replica must apply a run-time change. The
// promise is 1s; processes on a loaded 2-core machine get some slack, and
// the test logs what it measured.
const applyBound = 2 * time.Second

// waitScheduleLog waits for a JSON line after line from (p.log.Len())
// whose msg is msg and whose schedule is schedule.
func (p *proc) waitScheduleLog(from int, msg, schedule string, timeout time.Duration) {
	p.t.Helper()
	p.log.Wait(p.t, from, timeout, p.Exited(), fmt.Sprintf("%q for %s", msg, schedule), proctest.Msg(msg, "schedule", schedule))
}

// Three scheduler processes; a schedule is added, paused, resumed, changed
// and removed through the schedules package while they run. Every replica
// logs each change within the bound; the queue holds each tick once, none
// while paused, none of the old cron after the change; a bad change is
// refused with the config's message and changes nothing.
func TestRuntimeScheduleChangesOnThreeProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := writeConfig(t, srv.Addr, "scheduler:\n  max_clock_skew: 200ms\n  tick_lock_ttl: 1s\n  task_retention: 1h\n")
	var procs []*proc
	for range 3 {
		p := startProc(t, nil, "--config", cfg, "--http-addr", "127.0.0.1:0")
		p.waitLog("scheduler started", 10*time.Second)
		procs = append(procs, p)
	}
	ctx := t.Context()
	c := schedules.New(srv.Client())
	var slowest time.Duration
	// change runs f and waits until every replica logged msg for "rt".
	change := func(what, msg string, f func() error) time.Time {
		t.Helper()
		marks := make([]int, len(procs))
		for i, p := range procs {
			marks[i] = p.log.Len()
		}
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		at := time.Now()
		for i, p := range procs {
			p.waitScheduleLog(marks[i], msg, "rt", applyBound)
		}
		slowest = max(slowest, time.Since(at))
		return at
	}
	rt := schedules.Schedule{Name: "rt", Cron: "* * * * * *", Task: "test:tick", Queue: "rt", Payload: json.RawMessage(`{"n":1}`)}

	added := change("add", "schedule started", func() error { return c.Add(ctx, rt) })
	insp := asynq.NewInspectorFromRedisClient(srv.Client())
	first := time.Unix(added.Unix()+1, 0)
	waitQueued(t, insp, "rt", first.Add(2*time.Second), 5*time.Second)

	bad := rt
	bad.Cron, bad.Timezone = "0 0 25 * * *", "Mars/Olympus"
	err := c.Update(ctx, bad)
	for _, want := range []string{
		`schedule (rt).cron: invalid cron expression "0 0 25 * * *"`,
		`schedule (rt).timezone: unknown time zone "Mars/Olympus"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad Update = %v, want %q", err, want)
		}
	}
	if got, err := c.Get(ctx, "rt"); err != nil || got.Cron != rt.Cron || got.Timezone != "UTC" {
		t.Errorf("after a refused update: %+v, %v", got, err)
	}

	paused := change("pause", "schedule paused", func() error { _, err := c.Pause(ctx, "rt"); return err })
	time.Sleep(2500 * time.Millisecond) // the pause itself
	resumed := change("resume", "schedule started", func() error { _, err := c.Resume(ctx, "rt"); return err })

	rt.Cron = "*/2 * * * * *"
	updated := change("update", "schedule changed", func() error { return c.Update(ctx, rt) })
	next := time.Unix(updated.Unix()+2, 0)
	next = next.Add(time.Duration(next.Unix()%2) * time.Second)
	waitQueued(t, insp, "rt", next, 5*time.Second)

	removed := change("remove", "schedule removed", func() error { return c.Remove(ctx, "rt") })
	if err := c.Remove(ctx, "rt"); !errors.Is(err, schedules.ErrNotFound) {
		t.Errorf("second Remove = %v, want ErrNotFound", err)
	}
	t.Logf("slowest replica applied a change %v after it was made", slowest)

	for i, p := range procs {
		if code := p.term(10 * time.Second); code != 0 {
			t.Errorf("replica %d: exit code %d after SIGTERM; output:\n%s", i, code, p.output())
		}
	}

	// The queue: each tick once (asynq keeps one task per id; a second
	// enqueue would also have been logged as a duplicate).
	got := map[int64]bool{}
	tasks, err := insp.ListPendingTasks("rt", asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range tasks {
		u, err := strconv.ParseInt(strings.TrimPrefix(ti.ID, "rt:"), 10, 64)
		if err != nil {
			t.Errorf("unexpected task id %q", ti.ID)
			continue
		}
		got[u] = true
		tick := time.Unix(u, 0)
		switch late := time.Second + 200*time.Millisecond; { // max_clock_skew + 1s: still on time
		case tick.Before(first):
			t.Errorf("tick %v: before the add at %v", tick, added)
		case tick.After(paused.Add(applyBound)) && tick.Before(resumed.Add(-late)):
			t.Errorf("tick %v: enqueued while paused (%v..%v)", tick, paused, resumed)
		case tick.After(updated.Add(applyBound)) && u%2 == 1:
			t.Errorf("tick %v: of the old cron after the update at %v", tick, updated)
		case tick.After(removed.Add(applyBound)):
			t.Errorf("tick %v: after the removal at %v", tick, removed)
		}
	}
	for u := first.Unix(); u < paused.Unix(); u++ {
		if !got[u] {
			t.Errorf("tick %v before the pause: no task", time.Unix(u, 0))
		}
	}
	for _, p := range procs {
		if strings.Contains(p.output(), "tick was enqueued already") {
			t.Errorf("a replica enqueued a tick twice:\n%s", p.output())
		}
	}
}

// waitQueued waits until the task of schedule's tick is in queue schedule.
func waitQueued(t *testing.T, insp *asynq.Inspector, schedule string, tick time.Time, timeout time.Duration) {
	t.Helper()
	id := schedule + ":" + strconv.FormatInt(tick.Unix(), 10)
	redistest.WaitFor(t, timeout, "task "+id, func() bool {
		_, err := insp.GetTaskInfo(schedule, id)
		return err == nil
	})
}

// A schedule paused for a few ticks and resumed: `lockstep ticks` shows the
// ticks due while it was paused as skipped with reason paused (not
// catch_up), with catch_up skip (none of them enqueued) and once (the
// latest enqueued at the resume, the others skipped).
func TestPausedTicksAreSkippedWithReasonPaused(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"skip", "once"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			r := &overlapRig{t: t, srv: srv, cfg: writeConfig(t, srv.Addr, "scheduler:\n  max_clock_skew: 200ms\n  tick_lock_ttl: 1s\n  task_retention: 1h\n")}
			p := startProc(t, nil, "--config", r.cfg, "--http-addr", "127.0.0.1:0")
			p.waitLog("scheduler started", 10*time.Second)
			if code, out := r.lockstep("schedules", "add", "rt", "--cron", "* * * * * *", "--task", "test:tick", "--queue", "rt", "--catch-up", policy); code != 0 {
				t.Fatalf("schedules add: exit %d: %s", code, out)
			}
			insp := asynq.NewInspectorFromRedisClient(srv.Client())
			waitQueued(t, insp, "rt", time.Now().Truncate(time.Second).Add(time.Second), 5*time.Second)
			mark := p.log.Len()
			if code, out := r.lockstep("schedules", "pause", "rt"); code != 0 {
				t.Fatalf("schedules pause: exit %d: %s", code, out)
			}
			paused := time.Now()
			p.waitScheduleLog(mark, "schedule paused", "rt", applyBound)
			time.Sleep(4 * time.Second) // the pause itself: four ticks
			mark = p.log.Len()
			if code, out := r.lockstep("schedules", "resume", "rt"); code != 0 {
				t.Fatalf("schedules resume: exit %d: %s", code, out)
			}
			resumed := time.Now()
			p.waitScheduleLog(mark, "schedule started", "rt", applyBound)
			var skipped []cliTick
			redistest.WaitFor(t, 5*time.Second, "a skipped tick after the resume", func() bool {
				skipped = skipped[:0]
				code, out := r.lockstep("ticks", "rt", "--json")
				var ticks []cliTick
				if code != 0 || json.Unmarshal([]byte(out), &ticks) != nil {
					t.Fatalf("lockstep ticks rt --json: exit %d: %s", code, out)
				}
				slices.Reverse(ticks)
				for _, tk := range ticks {
					if tk.State == "skipped" {
						skipped = append(skipped, tk)
					}
				}
				return len(skipped) > 0
			})
			for _, tk := range skipped {
				if tk.Reason != "paused" {
					t.Errorf("tick %v skipped with reason %q, want paused", tk.Tick, tk.Reason)
				}
				if tk.Tick.Before(paused.Add(-time.Second)) || tk.Tick.After(resumed) {
					t.Errorf("tick %v skipped (%s), outside the pause %v..%v", tk.Tick, tk.Reason, paused, resumed)
				}
			}
			if policy == "once" {
				last := skipped[len(skipped)-1].Tick
				if _, err := insp.GetTaskInfo("rt", "rt:"+strconv.FormatInt(last.Unix()+1, 10)); err != nil {
					t.Errorf("catch_up once: the tick after the last skipped one (%v) has no task: %v", last, err)
				}
			}
		})
	}
}
