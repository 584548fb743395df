package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// loadedSkew is max_clock_skew for tests on the real clock: a tick is on
// time until max_clock_skew + 1s after it, and a test machine running many
// tests under the race detector can stall a process for a second.
const loadedSkew = 2 * time.Second

// Three replicas, one schedule every second: each tick is won by one replica
// and followed by the two others, and has one task.
func TestEveryTickOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "every-second"
	c := testConfig(loadedSkew, time.Second, sched(name, "* * * * * *", config.CatchUpSkip))
	rec := newRecorder()
	ids := []string{"r0", "r1", "r2"}
	ms := make([]*metrics.Metrics, len(ids))
	for i, id := range ids {
		ms[i] = metrics.New(prometheus.NewRegistry())
		replica(t, srv, c, rec, id, WithMetrics(ms[i]))
	}
	spec, _ := ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now())
	last := first.Add(4 * time.Second)
	rec.waitTicks(t, 5*time.Second, name, spec, first, last, ids...)
	assertExactlyOnce(t, srv.Client(), name, spec, first, last)

	evs := rec.all()
	for tick := first; !tick.After(last); tick = spec.Next(tick) {
		results := map[string]int{}
		for _, e := range evs {
			if e.Tick.Equal(tick) {
				results[e.Result]++
			}
		}
		if results[ResultEnqueued] != 1 || results[ResultFollower] != 2 || len(results) != 2 {
			t.Errorf("tick %v: results %v, want 1 enqueued and 2 follower", tick, results)
		}
	}

	var enqueued, lateness, changes float64
	for _, m := range ms {
		enqueued += testutil.ToFloat64(m.SchedulerTicks.WithLabelValues(name, ResultEnqueued))
		changes += testutil.ToFloat64(m.SchedulerLeaderChanges)
		lateness += float64(histogramCount(t, m.SchedulerTickLateness))
	}
	if enqueued < 5 || lateness != enqueued || changes > enqueued {
		t.Errorf("metrics: enqueued %v, lateness observations %v, leader changes %v", enqueued, lateness, changes)
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

// A leader that dies right after winning a tick (the crash point is chosen
// by the hook) does not lose it, and the tick still has one task.
func TestCrashBetweenClaimAndEnqueue(t *testing.T) {
	t.Parallel()
	testCrash(t, "claim", ResultEnqueued)
}

// A leader that dies after enqueuing but before marking the tick done: the
// takeover finds the task id and the tick has one task.
func TestCrashBetweenEnqueueAndDone(t *testing.T) {
	t.Parallel()
	testCrash(t, "enqueue", ResultDuplicate)
}

func testCrash(t *testing.T, point, takeoverResult string) {
	srv := redistest.Start(t)
	name := "crash-after-" + point
	c := testConfig(loadedSkew, time.Second, sched(name, "* * * * * *", config.CatchUpSkip))
	rec := newRecorder()
	var crashed atomic.Bool
	var crashedTick atomic.Int64
	var crashedID atomic.Value
	ids := []string{"a", "b", "c"}
	reps := map[string]*Scheduler{}
	for _, id := range ids {
		die := func(_ string, tick time.Time) bool {
			if !crashed.CompareAndSwap(false, true) {
				return false
			}
			crashedTick.Store(tick.Unix())
			crashedID.Store(id)
			rec.add(event{Replica: id, Schedule: name, Tick: tick, Result: "crashed"})
			return true
		}
		h := hooks{event: rec.add}
		if point == "claim" {
			h.afterClaim = die
		} else {
			h.afterEnqueue = die
		}
		reps[id] = replica(t, srv, c, nil, id, withHooks(h))
	}

	evs := rec.wait(t, 5*time.Second, "a crash", func(evs []event) bool {
		return slices.ContainsFunc(evs, func(e event) bool { return e.Result == "crashed" })
	})
	_ = evs
	tick := time.Unix(crashedTick.Load(), 0).UTC()
	dead := crashedID.Load().(string)
	// The hook records the crash just before the replica ends itself.
	redistest.WaitFor(t, 2*time.Second, "replica "+dead+" to stop being ready after its crash", func() bool {
		return reps[dead].Ready(t.Context()) != nil
	})
	// Lease 1s + sweep every 0.5s: a survivor takes the tick over.
	evs = rec.wait(t, 5*time.Second, "the takeover of "+tick.String(), func(evs []event) bool {
		return slices.ContainsFunc(evs, func(e event) bool {
			return e.Tick.Equal(tick) && e.Result == takeoverResult && e.Replica != dead
		})
	})

	var alive []string
	for _, id := range ids {
		if id != dead {
			alive = append(alive, id)
		}
	}
	spec, _ := ParseSpec("* * * * * *", nil)
	last := spec.Next(time.Now()).Add(2 * time.Second)
	rec.waitTicks(t, 5*time.Second, name, spec, spec.Next(time.Now()), last, alive...)
	assertExactlyOnce(t, srv.Client(), name, spec, tick, last)

	k := keysFor(c.Lock.Prefix, name)
	if err := srv.Client().HGet(t.Context(), k.state, pendingField(tick.Unix())).Err(); err != redis.Nil {
		t.Errorf("tick %v still pending: %v", tick, err)
	}
	if n := countResult(rec.all(), name, ResultMissed); n != 0 {
		t.Errorf("%d ticks missed", n)
	}
}

// Replicas whose clocks differ by max_clock_skew, two of them restarted
// mid-run: no tick is enqueued twice (the claim alone prevents it: no task
// id conflict happens) and none is lost.
func TestSkewedClocksNoDuplicates(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "skewed"
	skew := time.Second
	c := testConfig(skew, 3*time.Second, sched(name, "* * * * * *", config.CatchUpAll))
	rec := newRecorder()
	offsets := map[string]time.Duration{"slow": -skew / 2, "exact": 0, "fast": skew / 2}
	reps := map[string]*Scheduler{}
	for id, off := range offsets {
		reps[id] = replica(t, srv, c, rec, id, WithClock(skewedClock{off}))
	}
	spec, _ := ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now().Add(skew))
	for n := first; n.Before(first.Add(3 * time.Second)); n = spec.Next(n) {
		rec.waitTick(t, 5*time.Second, name, n, "slow", "exact", "fast")
	}
	for _, id := range []string{"fast", "slow"} {
		if err := reps[id].Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		replica(t, srv, c, rec, id+"-2", WithClock(skewedClock{offsets[id]}))
		n := spec.Next(time.Now().Add(skew))
		rec.waitTick(t, 5*time.Second, name, n, "exact", id+"-2")
	}
	last := spec.Next(time.Now().Add(skew)).Add(2 * time.Second)
	rec.waitTicks(t, 5*time.Second, name, spec, spec.Next(time.Now().Add(skew)), last, "exact", "fast-2", "slow-2")
	assertExactlyOnce(t, srv.Client(), name, spec, first, last)
	evs := rec.all()
	for _, r := range []string{ResultDuplicate, ResultMissed, "early"} {
		if n := countResult(evs, name, r); n != 0 {
			t.Errorf("%d %s events:\n%s", n, r, describeEvents(evs))
		}
	}
}

// All replicas down for 10 ticks of a schedule every second (injected
// clock): on restart, each catch-up policy does what it says.
func TestCatchUpAfterOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		policy           config.CatchUp
		cap              int
		caughtUp         []int // tick offsets (seconds after t0) enqueued by the catch-up
		missed           int
		resumesOnTimeAt  int
		beforeOutageUpTo int
	}{
		{name: "skip", policy: config.CatchUpSkip, missed: 10},
		{name: "once", policy: config.CatchUpOnce, caughtUp: []int{12}, missed: 9},
		{name: "all", policy: config.CatchUpAll, caughtUp: []int{3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{name: "all_capped", policy: config.CatchUpAll, cap: 4, caughtUp: []int{9, 10, 11, 12}, missed: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			s := sched("outage-"+tc.name, "* * * * * *", tc.policy)
			s.MaxCatchUp = tc.cap
			c := testConfig(0, time.Second, s) // on time = within 1s of the tick
			t0 := utc("2024-01-01T00:00:00Z")
			clock := newFakeClock(t0.Add(500 * time.Millisecond))
			rec := newRecorder()
			ctx := t.Context()

			var before []*Scheduler
			for i := range 3 {
				before = append(before, replica(t, srv, c, rec, fmt.Sprint("before-", i), WithClock(clock)))
			}
			for k := 0; k <= 2; k++ {
				clock.Set(t0.Add(time.Duration(k)*time.Second + 500*time.Millisecond))
				rec.waitTick(t, 5*time.Second, s.Name, t0.Add(time.Duration(k)*time.Second), "before-0", "before-1", "before-2")
			}
			for _, r := range before {
				if err := r.Stop(ctx); err != nil {
					t.Fatal(err)
				}
			}

			// Ticks 3..12 pass with no replica running; tick 13 is within
			// max_clock_skew + 1s of the restart, so it is on time.
			clock.Set(t0.Add(13*time.Second + 500*time.Millisecond))
			for i := range 3 {
				replica(t, srv, c, rec, fmt.Sprint("after-", i), WithClock(clock))
			}
			rec.waitTick(t, 5*time.Second, s.Name, t0.Add(13*time.Second), "after-0", "after-1", "after-2")
			clock.Set(t0.Add(14*time.Second + 500*time.Millisecond))
			rec.waitTick(t, 5*time.Second, s.Name, t0.Add(14*time.Second), "after-0", "after-1", "after-2")

			want := []int64{}
			for _, k := range append(append([]int{0, 1, 2}, tc.caughtUp...), 13, 14) {
				want = append(want, t0.Add(time.Duration(k)*time.Second).Unix())
			}
			if got := taskTicks(t, srv.Client(), s.Name); !slices.Equal(got, want) {
				t.Errorf("tasks at %v, want %v", got, want)
			}
			evs := rec.all()
			if n := countResult(evs, s.Name, ResultMissed); n != tc.missed {
				t.Errorf("missed %d, want %d\n%s", n, tc.missed, describeEvents(evs))
			}
			if n := countResult(evs, s.Name, ResultCaughtUp); n != len(tc.caughtUp) {
				t.Errorf("caught up %d, want %d\n%s", n, len(tc.caughtUp), describeEvents(evs))
			}
		})
	}
}

// Ticks across daylight-saving changes in Europe/Berlin, with a fake clock
// stepped to each tick: the task ids are the documented instants.
func TestDaylightSavingTicks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start string
		steps []string            // clock positions, in order (each a tick time or a time with no tick)
		want  map[string][]string // schedule -> tick times
	}{
		{
			name:  "spring_forward",
			start: "2024-03-30T23:10:00Z",
			steps: []string{"2024-03-31T00:00:00Z", "2024-03-31T01:00:00Z", "2024-03-31T02:00:00Z"},
			want: map[string][]string{
				"hourly": {"2024-03-31T00:00:00Z", "2024-03-31T01:00:00Z", "2024-03-31T02:00:00Z"},
				"daily":  {"2024-03-31T01:00:00Z"}, // 02:30 does not exist: fired at 03:00 CEST
			},
		},
		{
			name:  "fall_back",
			start: "2024-10-26T23:10:00Z",
			steps: []string{"2024-10-27T00:00:00Z", "2024-10-27T00:30:00Z", "2024-10-27T01:00:00Z", "2024-10-27T01:30:00Z", "2024-10-27T02:00:00Z"},
			want: map[string][]string{
				"hourly": {"2024-10-27T00:00:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"}, // both passes
				"daily":  {"2024-10-27T00:30:00Z"},                                                 // 02:30 CEST only, not 02:30 CET
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			daily := sched("daily", "30 2 * * *", config.CatchUpSkip)
			hourly := sched("hourly", "0 * * * *", config.CatchUpSkip)
			daily.Timezone, hourly.Timezone = "Europe/Berlin", "Europe/Berlin"
			c := testConfig(0, time.Second, daily, hourly)
			clock := newFakeClock(utc(tc.start))
			rec := newRecorder()
			replica(t, srv, c, rec, "solo", WithClock(clock))
			for _, step := range tc.steps {
				at := utc(step)
				clock.Set(at.Add(200 * time.Millisecond))
				for name, ticks := range tc.want {
					if slices.Contains(ticks, step) {
						rec.waitTick(t, 5*time.Second, name, at, "solo")
					}
				}
			}
			for name, ticks := range tc.want {
				var want []int64
				for _, w := range ticks {
					want = append(want, utc(w).Unix())
				}
				if got := taskTicks(t, srv.Client(), name); !slices.Equal(got, want) {
					t.Errorf("%s: tasks at %v, want %v", name, got, want)
				}
			}
		})
	}
}

// A replica whose clock is behind by more than max_clock_skew, or that
// restarts with its clock stepped back, finds the ticks done: ticks never go
// backwards.
func TestSlowClockNeverRepeatsTicks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "never-back"
	c := testConfig(0, time.Second, sched(name, "* * * * * *", config.CatchUpAll))
	t0 := utc("2024-01-01T00:00:00Z")
	ahead := newFakeClock(t0.Add(500 * time.Millisecond))
	behind := newFakeClock(t0.Add(-3*time.Second + 500*time.Millisecond))
	rec := newRecorder()
	replica(t, srv, c, rec, "ahead", WithClock(ahead))
	for k := 0; k <= 4; k++ {
		ahead.Set(t0.Add(time.Duration(k)*time.Second + 500*time.Millisecond))
		rec.waitTick(t, 5*time.Second, name, t0.Add(time.Duration(k)*time.Second), "ahead")
	}
	replica(t, srv, c, rec, "behind", WithClock(behind))
	for k := -3; k <= 4; k++ {
		behind.Set(t0.Add(time.Duration(k)*time.Second + 500*time.Millisecond))
		rec.waitTick(t, 5*time.Second, name, t0.Add(time.Duration(k)*time.Second), "behind")
	}
	for _, e := range rec.all() {
		if e.Replica == "behind" && e.Result != ResultFollower {
			t.Errorf("behind: %v %s, want follower", e.Tick, e.Result)
		}
	}
	want := unixTimes(t0, t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second), t0.Add(4*time.Second))
	if got := taskTicks(t, srv.Client(), name); !slices.Equal(got, want) {
		t.Errorf("tasks at %v, want %v", got, want)
	}
}

// A replica whose clock runs ahead of Redis's by more than max_clock_skew
// + 1s is refused: it cannot move the watermark into the future and stall
// the others.
func TestClockAheadOfRedisIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "refuse-ahead"
	c := testConfig(loadedSkew, time.Second, sched(name, "* * * * * *", config.CatchUpSkip))
	rec := newRecorder()
	replica(t, srv, c, rec, "hour-ahead", WithClock(skewedClock{time.Hour}))
	rec.wait(t, 5*time.Second, "a refused claim", func(evs []event) bool {
		return countResult(evs, name, "early") > 0
	})
	replica(t, srv, c, rec, "on-time")
	spec, _ := ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now())
	last := first.Add(2 * time.Second)
	rec.waitTicks(t, 5*time.Second, name, spec, first, last, "on-time")
	assertExactlyOnce(t, srv.Client(), name, spec, first, last)
	for _, u := range taskTicks(t, srv.Client(), name) {
		if u > time.Now().Add(time.Minute).Unix() {
			t.Errorf("task for tick %v, in the future", time.Unix(u, 0))
		}
	}
}

// A replica that starts finds the ticks left pending by dead leaders: it
// takes over one within task_retention, and drops (counts as missed) one too
// old to enqueue safely.
func TestTakeoverOnStartAndHorizon(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "orphans"
	c := testConfig(0, time.Second, sched(name, "*/10 * * * *", config.CatchUpSkip))
	now := utc("2024-06-01T12:05:00Z")
	recent, old := utc("2024-06-01T12:00:00Z"), utc("2024-06-01T10:00:00Z")
	k := keysFor(c.Lock.Prefix, name)
	cl := srv.Client()
	ctx := t.Context()
	if err := cl.HSet(ctx, k.state, "tick", recent.Unix(), "leader", "dead").Err(); err != nil {
		t.Fatal(err)
	}
	// Two ticks pending, their leases long over.
	cl.HSet(ctx, k.state, pendingField(recent.Unix()), "1 dead/1", pendingField(old.Unix()), "1 dead/2")

	rec := newRecorder()
	replica(t, srv, c, rec, "heir", WithClock(newFakeClock(now)))
	rec.wait(t, 5*time.Second, "takeover and drop", func(evs []event) bool {
		return slices.ContainsFunc(evs, func(e event) bool { return e.Tick.Equal(recent) && e.Result == ResultEnqueued }) &&
			slices.ContainsFunc(evs, func(e event) bool { return e.Tick.Equal(old) && e.Result == ResultMissed })
	})
	if got := taskTicks(t, cl, name); !slices.Equal(got, unixTimes(recent)) {
		t.Errorf("tasks at %v, want %v", got, unixTimes(recent))
	}
	if n := pendingTicks(t, cl, k); len(n) != 0 {
		t.Errorf("pending: %v; want none", n)
	}
}

// The fx module starts the scheduler with the app and stops it with it.
func TestModule(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "fx"
	c := testConfig(0, time.Second, sched(name, "* * * * * *", config.CatchUpSkip))
	var s *Scheduler
	app := fx.New(
		fx.NopLogger,
		fx.Supply(c),
		fx.Provide(func() redis.UniversalClient { return srv.Client() }),
		Module,
		fx.Populate(&s),
	)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Errorf("Ready after start: %v", err)
	}
	redistest.WaitFor(t, 5*time.Second, "a tick enqueued", func() bool { return len(taskTicks(t, srv.Client(), name)) > 0 })
	if err := app.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err == nil {
		t.Error("Ready after stop: nil")
	}
}

// Redis stops answering (SIGSTOP) for several ticks and comes back with its
// data. Claims that were sent before the pause run when it ends, after their
// senders gave up; those ticks are taken over, the others caught up (policy
// all): every tick has one task.
func TestRedisPausedTicksRecovered(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const name = "paused"
	c := testConfig(loadedSkew, time.Second, sched(name, "* * * * * *", config.CatchUpAll))
	rec := newRecorder()
	ids := []string{"p0", "p1", "p2"}
	for _, id := range ids {
		replicaOn(t, srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }), c, rec, id)
	}
	spec, _ := ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now())
	rec.waitTick(t, 5*time.Second, name, first, ids...)

	srv.Pause()
	paused := time.Now()
	// The fault lasts five ticks, longer than max_clock_skew + 1s: this wait
	// is its duration, not a guess about when something happened.
	time.Sleep(5 * time.Second)
	srv.Resume()
	t.Logf("paused for %v", time.Since(paused))

	after := spec.Next(time.Now().Add(time.Second))
	last := after.Add(2 * time.Second)
	rec.waitTicks(t, 10*time.Second, name, spec, after, last, ids...)
	// Ticks of the pause are enqueued by the catch-up or by takeovers.
	cl := srv.Client()
	k := keysFor(c.Lock.Prefix, name)
	redistest.WaitFor(t, 10*time.Second, fmt.Sprintf("no tick before %v pending", after), func() bool {
		for _, u := range pendingTicks(t, cl, k) {
			if u < after.Unix() {
				return false
			}
		}
		return true
	})
	assertExactlyOnce(t, cl, name, spec, first, last)
	evs := rec.all()
	t.Logf("caught up %d, duplicates %d", countResult(evs, name, ResultCaughtUp), countResult(evs, name, ResultDuplicate))
	if n := countResult(evs, name, ResultMissed); n != 0 {
		t.Errorf("%d ticks missed:\n%s", n, describeEvents(rec.all()))
	}
}

// On a Redis Cluster, each schedule's scripts touch one slot (the keys share
// the hash tag {schedule:<name>}), and schedules spread over the masters.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	names := []string{"alpha", "beta", "gamma", "delta"}
	var scheds []config.Schedule
	for _, n := range names {
		scheds = append(scheds, sched(n, "* * * * * *", config.CatchUpAll))
	}
	c := testConfig(loadedSkew, time.Second, scheds...)
	rec := newRecorder()
	ids := []string{"c0", "c1"}
	for _, id := range ids {
		replicaOn(t, cluster.Client(), c, rec, id)
	}
	spec, _ := ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now())
	last := first.Add(2 * time.Second)
	for n := first; !n.After(last); n = spec.Next(n) {
		for _, name := range names {
			rec.waitTick(t, 5*time.Second, name, n, ids...)
		}
	}
	slots := map[*redistest.Server]bool{}
	for _, name := range names {
		assertExactlyOnce(t, cluster.Client(), name, spec, first, last)
		slots[cluster.NodeFor(keysFor(c.Lock.Prefix, name).state)] = true
	}
	t.Logf("%d schedules on %d masters", len(names), len(slots))
}
