package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/chaos"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

const chaosSchedule = `
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: 1s
  task_retention: 1h
schedules:
  - name: chaos
    cron: "* * * * * *"
    task: test:tick
    payload: {"n": 1}
    catch_up: all
`

// Three replicas, a schedule every second, about 30 s; a random replica is
// SIGKILLed every few ticks at a random offset inside a tick (often within
// the first milliseconds, between a claim and its enqueue) and restarted.
// What each replica claimed (its own log lines, not asynq's task ids, which
// would collapse two winners into one task) shows every tick claimed once,
// apart from takeovers of a dead leader's tick, and every tick has its task.
func TestKillReplicasEveryTickOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := startReplicas(t, srv, chaosSchedule)
	rng, spec := run.rng, run.spec
	begin := time.Now()
	kills := 0
	for i := 0; i < 12 && time.Since(begin) < 30*time.Second; i++ {
		// Let 1 to 3 ticks pass, then kill one replica at a random moment within a tick.
		waitTask(t, run.insp, "chaos", spec.Next(time.Now()).Add(time.Duration(rng.IntN(3))*time.Second), 10*time.Second)
		sleepIntoTick(rng)
		// Every other kill takes the replica that claimed last: with a
		// first claimer per schedule (rendezvous), a random victim could
		// spare it all run, and no other replica would ever claim.
		victim := rng.IntN(len(run.live))
		if i%2 == 0 {
			victim = run.latestClaimer("chaos", victim)
		}
		run.restart(victim)
		kills++
	}
	last := run.finish(srv, 10*time.Second, 2, "chaos")
	t.Logf("%d kills, ticks %v .. %v", kills, run.first, last)
}

// Redis is SIGKILLed at a random offset inside a tick and restarted from its
// append-only file (appendfsync always), three times: the replicas' watermarks
// and pending ticks survive, so no tick is claimed twice and none is lost
// (catch_up: all enqueues the ticks due while Redis was down).
func TestRedisKillAOFRestartEveryTickOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.StartAOF(t)
	run := startReplicas(t, srv, chaosSchedule)
	run.inTicks(func() {
		srv.Kill()
		time.Sleep(time.Duration(200+run.rng.IntN(1500)) * time.Millisecond) // Redis down across ticks
		srv.Restart()
	})
	run.finish(srv, 15*time.Second, 1, "chaos")
}

// Redis is paused (SIGSTOP) for longer than tick_lock_ttl while every replica
// is claiming: with catch_up: all, each tick due meanwhile is enqueued once
// Redis answers again. (Found by make chaos, seed 1: an on-time claim that
// waited out the pause moved the watermark past an earlier tick nobody had
// claimed, and the catch-up, reading the watermark after it, skipped that
// tick.) It fails about every second run until the scheduler is fixed; set
// LOCKSTEP_TEST_KNOWN_DEFECTS=1 to run it.
func TestRedisPausedPastTickLockTTLCatchesUpEveryTick(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	names := []string{"chaos", "chaos-b", "chaos-c"}
	body := chaosSchedule
	for _, n := range names[1:] {
		body += strings.ReplaceAll(chaosSchedule[strings.Index(chaosSchedule, "  - name: chaos"):], "name: chaos", "name: "+n)
	}
	run := startReplicas(t, srv, body, "LOCKSTEP_REDIS_READ_TIMEOUT=1s", "LOCKSTEP_REDIS_WRITE_TIMEOUT=1s", "LOCKSTEP_REDIS_DIAL_TIMEOUT=1s")
	run.inTicks(func() {
		srv.Pause()
		time.Sleep(time.Duration(2500+run.rng.IntN(2500)) * time.Millisecond) // past tick_lock_ttl (1s) and the claim deadline
		srv.Resume()
	})
	run.finish(srv, 15*time.Second, 1, names...)
}

// replicaRun is three scheduler replicas and every process that held a slot,
// with the test's random source and its every-second schedule's first tick
// after the replicas started.
type replicaRun struct {
	t     *testing.T
	cfg   string
	env   []string
	insp  *asynq.Inspector
	live  []*proc
	all   []*proc
	rng   *rand.Rand
	spec  scheduler.Spec // every second
	first time.Time
}

func startReplicas(t *testing.T, srv *redistest.Server, body string, env ...string) *replicaRun {
	t.Helper()
	r := &replicaRun{t: t, cfg: writeConfig(t, srv.Addr, body), env: env, insp: asynq.NewInspectorFromRedisClient(srv.Client())}
	for range 3 {
		r.live = append(r.live, r.start())
	}
	r.rng, _ = seeded(t)
	r.spec, _ = scheduler.ParseSpec("* * * * * *", nil)
	r.first = r.spec.Next(time.Now())
	return r
}

// start starts a replica that logs its claims (debug level).
func (r *replicaRun) start() *proc {
	p := startProc(r.t, append([]string{"LOCKSTEP_LOG_LEVEL=debug"}, r.env...), "--config", r.cfg, "--http-addr", "127.0.0.1:0")
	p.waitStatus("/readyz", 200, 10*time.Second)
	r.all = append(r.all, p)
	return p
}

// restart SIGKILLs replica k and starts another in its place.
func (r *replicaRun) restart(k int) {
	r.live[k].Kill()
	r.live[k] = r.start()
}

// latestClaimer returns the index of the live replica whose log has the
// latest claim of schedule, or fallback when none has one.
func (r *replicaRun) latestClaimer(schedule string, fallback int) int {
	r.t.Helper()
	best, at := fallback, time.Time{}
	for i, p := range r.live {
		var h chaos.History
		if err := chaos.ReadReplicaLog(strings.NewReader(p.output()), &h); err != nil {
			continue
		}
		for _, c := range h.Claims {
			if c.Schedule == schedule && c.At.After(at) {
				best, at = i, c.At
			}
		}
	}
	return best
}

// stop sends SIGTERM to every live replica: each exits 0.
func (r *replicaRun) stop() {
	for i, p := range r.live {
		if code := p.term(10 * time.Second); code != 0 {
			r.t.Errorf("replica %d: exit code %d after SIGTERM; output:\n%s", i, code, p.output())
		}
	}
}

// inTicks injects fault three times, each at a random moment within a tick,
// once the next tick of schedule chaos has its task.
func (r *replicaRun) inTicks(fault func()) {
	for range 3 {
		waitTask(r.t, r.insp, "chaos", r.spec.Next(time.Now()).Add(time.Second), 15*time.Second)
		sleepIntoTick(r.rng)
		fault()
	}
}

// finish waits (each up to timeout) for the task of every tick of the
// schedules from r.first to two seconds from now, stops the replicas, and
// checks that each of those ticks was enqueued exactly once and claimed by at
// least minReplicas processes over the run (see assertClaims). It returns
// the last tick checked.
func (r *replicaRun) finish(srv *redistest.Server, timeout time.Duration, minReplicas int, schedules ...string) time.Time {
	r.t.Helper()
	spec, first := r.spec, r.first
	last := spec.Next(time.Now()).Add(2 * time.Second)
	for _, name := range schedules {
		for n := first; !n.After(last); n = spec.Next(n) {
			waitTask(r.t, r.insp, name, n, timeout)
		}
	}
	r.stop()
	for _, name := range schedules {
		assertExactlyOnce(r.t, srv.Client(), name, spec, first, last)
		r.assertClaims(name, spec, first, last, minReplicas)
	}
	return last
}

// assertClaims reads every replica's own record of the ticks it claimed and
// enqueued, and checks with the chaos checker that no tick in [from, to] was
// claimed (other than by a takeover of an unfinished tick) or enqueued afresh
// twice, and that every tick was claimed by somebody.
//
// minReplicas is how many replica processes must have claimed: a test that
// kills the claiming replica needs others to take over; without kills, one
// first claimer per schedule (rendezvous) may claim every tick.
func (r *replicaRun) assertClaims(schedule string, spec scheduler.Spec, from, to time.Time, minReplicas int) {
	r.t.Helper()
	h := chaos.History{ReplicaLogsComplete: true, ExecutionsComplete: true, WritesAvailable: true, WritesComplete: true}
	for _, p := range r.all {
		if err := chaos.ReadReplicaLog(strings.NewReader(p.output()), &h); err != nil {
			r.t.Fatal(err)
		}
	}
	claimed := map[int64]bool{}
	for _, c := range h.Claims {
		if c.Schedule == schedule {
			claimed[c.Tick] = true
		}
	}
	replicas := map[string]bool{}
	for _, c := range h.Claims {
		replicas[c.Replica] = true
	}
	n := 0
	for tick := spec.Next(from.Add(-time.Second)); !tick.After(to); tick = spec.Next(tick) {
		n++
		if !claimed[tick.Unix()] {
			r.t.Errorf("tick %v: no replica logged a claim", tick)
		}
	}
	rep := chaos.Check(h)
	if rep.TicksClaimedTwice != 0 || rep.TicksEnqueuedTwice != 0 {
		for _, v := range rep.Evidence {
			r.t.Errorf("%s: %s", v.Check, v.Detail)
		}
	}
	if len(replicas) < minReplicas {
		r.t.Errorf("claims came from %d replicas; the test needs them from at least %d", len(replicas), minReplicas)
	}
	r.t.Logf("%d ticks, %d claims (%d takeovers) and %d enqueues from %d replica processes",
		n, len(h.Claims), rep.TicksTakenOver, len(h.Enqueues), len(replicas))
}

// seeded returns a random source whose seed the test logs.
func seeded(t *testing.T) (*rand.Rand, int64) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(uint64(seed), 0)), seed
}

// sleepIntoTick sleeps to a random offset inside the next second: half of
// the time within its first 40ms, when replicas claim and enqueue.
func sleepIntoTick(rng *rand.Rand) {
	offset := time.Duration(rng.IntN(1000)) * time.Millisecond
	if rng.IntN(2) == 0 {
		offset = time.Duration(rng.IntN(40)) * time.Millisecond
	}
	next := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(next.Add(offset))) // the offset is the point of the test
}

// waitTask waits until the task of schedule's tick exists.
func waitTask(t *testing.T, insp *asynq.Inspector, schedule string, tick time.Time, timeout time.Duration) {
	t.Helper()
	id := scheduler.TaskID(schedule, tick)
	redistest.WaitFor(t, timeout, "task "+id+" enqueued", func() bool {
		_, err := insp.GetTaskInfo("default", id)
		if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatalf("GetTaskInfo %s: %v", id, err)
		}
		return err == nil
	})
}

// assertExactlyOnce lists the queue with asynq's Inspector: every tick in
// [from, to] has one task, and no task of the schedule in that window is off
// the tick grid.
func assertExactlyOnce(t *testing.T, c redis.UniversalClient, schedule string, spec scheduler.Spec, from, to time.Time) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(c)
	count := map[string]int{}
	for page := 1; page < 100; page++ {
		tasks, err := insp.ListPendingTasks("default", asynq.PageSize(1000), asynq.Page(page))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range tasks {
			if strings.HasPrefix(ti.ID, schedule+":") {
				count[ti.ID]++
			}
		}
		if len(tasks) < 1000 {
			break
		}
	}
	want := map[string]bool{}
	n := 0
	for tick := spec.Next(from.Add(-time.Second)); !tick.After(to); tick = spec.Next(tick) {
		id := scheduler.TaskID(schedule, tick)
		want[id] = true
		n++
		if count[id] != 1 {
			t.Errorf("tick %v: %d tasks with id %s, want 1", tick, count[id], id)
		}
	}
	for id := range count {
		var u int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(id, schedule+":"), "%d", &u); err != nil {
			t.Errorf("unexpected task id %q", id)
			continue
		}
		if u >= from.Unix() && u <= to.Unix() && !want[id] {
			t.Errorf("task %s is not a tick", id)
		}
	}
	t.Logf("%d ticks checked, %d tasks in the queue", n, len(count))
}

// Bad configurations and flags: exit code 2 and one line on stderr naming
// where the value came from, the schedule and the field.
func TestBadConfigExits2(t *testing.T) {
	t.Parallel()
	schedule := func(fields string) string {
		return "schedules:\n  - name: settle-orders\n    task: demo:order.pay\n" + fields
	}
	for _, tc := range []struct {
		name string
		body string
		args []string
		env  []string
		want []string
	}{
		{name: "cron syntax", body: schedule("    cron: \"61 * * * *\"\n"),
			want: []string{"scheduler.yaml", `schedules[0] (settle-orders).cron: invalid cron expression "61 * * * *"`}},
		{name: "every not whole seconds", body: schedule("    cron: \"@every 1500ms\"\n"),
			want: []string{"scheduler.yaml", "schedules[0] (settle-orders).cron: @every 1500ms: must be a whole number of seconds"}},
		{name: "unknown time zone", body: schedule("    cron: \"@hourly\"\n    timezone: Mars/Olympus\n"),
			want: []string{"scheduler.yaml: line ", `schedules[0] (settle-orders).timezone: unknown time zone "Mars/Olympus"`}},
		{name: "duplicate names", body: schedule("    cron: \"@hourly\"\n  - name: settle-orders\n    cron: \"@daily\"\n    task: t\n"),
			want: []string{`schedules[1] (settle-orders).name: duplicate name "settle-orders"`}},
		{name: "unknown key", body: schedule("    cron: \"@hourly\"\n    crn: \"@daily\"\n"),
			want: []string{"scheduler.yaml: line 10", `unknown field "crn"`}},
		{name: "payload not an object", body: schedule("    cron: \"@hourly\"\n    payload: [1, 2]\n"),
			want: []string{"schedules[0] (settle-orders).payload: must be a mapping (JSON object)"}},
		{name: "catch_up", body: schedule("    cron: \"@hourly\"\n    catch_up: sometimes\n"),
			want: []string{`schedules[0] (settle-orders).catch_up: must be skip, once or all, got "sometimes"`}},
		{name: "cron from env", body: "", env: []string{`LOCKSTEP_SCHEDULES=[{"name":"nightly","cron":"0 0 25 * * *","task":"t"}]`},
			want: []string{"env LOCKSTEP_SCHEDULES: schedules[0] (nightly).cron: invalid cron expression"}},
		{name: "retention too short", body: "scheduler:\n  tick_lock_ttl: 1m\n  task_retention: 30s\n",
			want: []string{"scheduler.yaml: scheduler.task_retention: must be greater than"}},
		{name: "retention from env", env: []string{"LOCKSTEP_SCHEDULER_TASK_RETENTION=1s"},
			want: []string{"env LOCKSTEP_SCHEDULER_TASK_RETENTION: must be greater than"}},
		{name: "http addr flag", body: schedule("    cron: \"@hourly\"\n"), args: []string{"--http-addr", "localhost"},
			want: []string{`flag --http-addr: invalid address "localhost"`}},
		{name: "missing file", args: []string{"--config", "/nonexistent/scheduler.yaml"},
			want: []string{"/nonexistent/scheduler.yaml: cannot read config"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, "127.0.0.1:6379", tc.body)
			args := append([]string{"--config", path}, tc.args...)
			p := startProc(t, tc.env, args...)
			if code := p.exit(10 * time.Second); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			out := p.output()
			if strings.Count(out, "\n") != 0 || out == "" {
				t.Errorf("stderr is not one line:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("stderr %q does not contain %q", out, w)
				}
			}
		})
	}
}

// The binary serves /healthz, /metrics and /readyz (which follows Redis),
// takes LOCKSTEP_* overrides and exits 0 on SIGTERM.
func TestServesAndExitsOnSIGTERM(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := writeConfig(t, "127.0.0.1:1", strings.ReplaceAll(chaosSchedule, "name: chaos", "name: served"))
	p := startProc(t, []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr, "LOCKSTEP_HTTP_ADDR=127.0.0.1:0"}, "--config", cfg)
	p.waitStatus("/readyz", 200, 10*time.Second)
	if body := p.waitStatus("/healthz", 200, time.Second); body != "ok\n" {
		t.Errorf("/healthz: %q", body)
	}
	spec, _ := scheduler.ParseSpec("* * * * * *", nil)
	waitTask(t, asynq.NewInspectorFromRedisClient(srv.Client()), "served", spec.Next(time.Now()), 5*time.Second)
	metrics := p.waitStatus("/metrics", 200, time.Second)
	for _, m := range []string{`lockstep_scheduler_ticks_total{result="enqueued",schedule="served"}`, "lockstep_scheduler_tick_lateness_seconds_bucket"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	srv.Kill()
	if body := p.waitStatus("/readyz", 503, 10*time.Second); !strings.Contains(body, "redis: ") {
		t.Errorf("/readyz with Redis down: %q", body)
	}
	p.waitStatus("/metrics", 200, time.Second)
	srv.Restart()
	p.waitStatus("/readyz", 200, 10*time.Second)

	if code := p.term(10 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM; output:\n%s", code, p.output())
	}
	p.waitLog("scheduler stopped", time.Second)
}
