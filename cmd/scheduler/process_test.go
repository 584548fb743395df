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
// SIGKILLed every few ticks and restarted. Every tick in the window has
// exactly one task with its task id: no gap, no duplicate.
func TestKillReplicasEveryTickOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := writeConfig(t, srv.Addr, chaosSchedule)
	insp := asynq.NewInspectorFromRedisClient(srv.Client())
	start := func() *proc {
		p := startProc(t, nil, "--config", cfg, "--http-addr", "127.0.0.1:0")
		p.waitStatus("/readyz", 200, 10*time.Second)
		return p
	}
	procs := []*proc{start(), start(), start()}

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)

	spec, _ := scheduler.ParseSpec("* * * * * *", nil)
	first := spec.Next(time.Now())
	begin := time.Now()
	kills := 0
	for i := 0; i < 20 && time.Since(begin) < 30*time.Second; i++ {
		// Let 2 to 4 ticks be enqueued, then kill one replica at a random moment within a tick.
		waitTask(t, insp, "chaos", spec.Next(time.Now()).Add(time.Duration(1+rng.IntN(3))*time.Second), 10*time.Second)
		k := rng.IntN(len(procs))
		procs[k].kill()
		kills++
		procs[k] = start()
	}
	last := spec.Next(time.Now()).Add(2 * time.Second)
	for n := first; !n.After(last); n = spec.Next(n) {
		waitTask(t, insp, "chaos", n, 10*time.Second)
	}
	for i, p := range procs {
		if code := p.term(10 * time.Second); code != 0 {
			t.Errorf("replica %d: exit code %d after SIGTERM; output:\n%s", i, code, p.output())
		}
	}
	t.Logf("%d kills, ticks %v .. %v", kills, first, last)
	assertExactlyOnce(t, srv.Client(), "chaos", spec, first, last)
}

// waitTask waits until the task of schedule's tick exists.
func waitTask(t *testing.T, insp *asynq.Inspector, schedule string, tick time.Time, timeout time.Duration) {
	t.Helper()
	id := scheduler.TaskID(schedule, tick)
	deadline := time.Now().Add(timeout)
	for {
		_, err := insp.GetTaskInfo("default", id)
		if err == nil {
			return
		}
		if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatalf("GetTaskInfo %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not enqueued within %v", id, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the queue, the observable itself
	}
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
			count[ti.ID]++
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
		if _, err := fmt.Sscanf(strings.TrimPrefix(id, schedule+":"), "%d", &u); err != nil || !strings.HasPrefix(id, schedule+":") {
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
