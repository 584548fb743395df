package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

const backfillSchedule = `
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: 1s
  task_retention: 1h
schedules:
  - name: bf
    cron: "* * * * * *"
    task: test:tick
`

// backfillTick is one tick of `lockstep schedules backfill --json`.
type backfillTick struct {
	Tick   time.Time `json:"tick"`
	TaskID string    `json:"task_id"`
	Result string    `json:"result"`
}

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// backfill runs `lockstep schedules backfill` with args and returns its
// exit code, its ticks (exit 0) and its output.
func (r *overlapRig) backfill(args ...string) (int, []backfillTick, string) {
	r.t.Helper()
	code, out := r.lockstep(append([]string{"--config", r.cfg, "schedules", "backfill"}, args...)...)
	var ticks []backfillTick
	if code == 0 && slices.Contains(args, "--json") {
		if err := json.Unmarshal([]byte(out), &ticks); err != nil {
			r.t.Fatalf("backfill --json: %v\n%s", err, out)
		}
	}
	return code, ticks, out
}

// taskIDs returns the ids of every pending task in the default queue.
func taskIDs(t *testing.T, insp *asynq.Inspector) map[string]int {
	t.Helper()
	ids := map[string]int{}
	tasks, err := insp.ListPendingTasks("default", asynq.PageSize(10000))
	if err != nil && !strings.Contains(err.Error(), "not found") {
		t.Fatal(err)
	}
	for _, ti := range tasks {
		ids[ti.ID]++
	}
	return ids
}

// Two backfills of the same range, racing each other and the live
// scheduler, enqueue each past tick once: the ticks before the schedule
// first ran by one of them, the ticks the scheduler enqueued by neither; a
// third finds every tick enqueued. A dry run enqueues nothing; bad ranges
// exit 2 naming the flag, with nothing enqueued.
func TestBackfillTwiceEnqueuesEachTickOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := &overlapRig{t: t, srv: srv, cfg: writeConfig(t, srv.Addr, backfillSchedule)}
	started := time.Now().Truncate(time.Second)
	var replicas []*proc
	for range 2 {
		p := startProc(t, nil, "--config", r.cfg, "--http-addr", "127.0.0.1:0")
		p.waitStatus("/readyz", 200, 10*time.Second)
		replicas = append(replicas, p)
	}
	insp := asynq.NewInspectorFromRedisClient(srv.Client())
	waitTask(t, insp, "bf", started.Add(2*time.Second), 10*time.Second)

	// The first tick the scheduler enqueued: the ticks before it are the
	// backfills' to enqueue.
	firstRun := started.Add(2 * time.Second)
	for id := range taskIDs(t, insp) {
		var u int64
		if _, err := fmt.Sscanf(id, "bf:%d", &u); err == nil && time.Unix(u, 0).Before(firstRun) {
			firstRun = time.Unix(u, 0)
		}
	}
	from, to := started.Add(-10*time.Second), started.Add(2*time.Second)
	results := make([][]backfillTick, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, ticks, out := r.backfill("bf", "--from", rfc(from), "--to", rfc(to), "--json")
			if code != 0 {
				t.Errorf("backfill %d: exit %d: %s", i, code, out)
			}
			results[i] = ticks
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	enqueued := map[string]int{}
	for i, ticks := range results {
		if len(ticks) != 13 {
			t.Errorf("backfill %d: %d ticks, want the 13 of [%v, %v]", i, len(ticks), from, to)
		}
		for _, tk := range ticks {
			switch tk.Result {
			case scheduler.BackfillEnqueued:
				enqueued[tk.TaskID]++
			case scheduler.BackfillExists, scheduler.BackfillScheduler:
			default:
				t.Errorf("backfill %d: tick %v: result %q", i, tk.Tick, tk.Result)
			}
			if want := scheduler.TaskID("bf", tk.Tick); tk.TaskID != want {
				t.Errorf("tick %v: task id %q, want %q", tk.Tick, tk.TaskID, want)
			}
		}
	}
	queued := taskIDs(t, insp)
	for tick := from; !tick.After(to); tick = tick.Add(time.Second) {
		id := scheduler.TaskID("bf", tick)
		if queued[id] != 1 {
			t.Errorf("tick %v: %d tasks, want 1", tick, queued[id])
		}
		if before := tick.Before(firstRun); before != (enqueued[id] == 1) || enqueued[id] > 1 {
			t.Errorf("tick %v (before the first run: %v): enqueued by %d backfills", tick, before, enqueued[id])
		}
	}

	// The replicas' /metrics count each backfilled tick once, summed over
	// them: the replica that sweeps the schedule takes the backfills' count
	// at a full sweep (20 sweeps of tick_lock_ttl/2: 10s here).
	backfilled := func() int {
		n := 0
		for _, p := range replicas {
			n += tickCount(t, p.waitStatus("/metrics", 200, 5*time.Second), "bf", "backfilled")
		}
		return n
	}
	redistest.WaitFor(t, 25*time.Second, fmt.Sprintf("ticks_total{result=backfilled} = %d", len(enqueued)), func() bool {
		return backfilled() >= len(enqueued)
	})

	// Again: every tick was enqueued already.
	_, again, _ := r.backfill("bf", "--from", rfc(from), "--to", rfc(to), "--json")
	for _, tk := range again {
		if tk.Result == scheduler.BackfillEnqueued {
			t.Errorf("third backfill enqueued %v again", tk.Tick)
		}
	}
	code, out := r.lockstep("ticks", "bf", "--last", "100", "--json")
	if code != 0 || !strings.Contains(out, `"leader": "backfill"`) {
		t.Errorf("lockstep ticks bf: exit %d, no tick with leader backfill:\n%s", code, out)
	}

	// A dry run prints the ticks and enqueues nothing.
	dryFrom := started.Add(-30 * time.Second)
	code, dry, out := r.backfill("bf", "--from", rfc(dryFrom), "--to", rfc(dryFrom.Add(4*time.Second)), "--dry-run", "--json")
	if code != 0 || len(dry) != 5 {
		t.Fatalf("dry run: exit %d, %d ticks, want 5: %s", code, len(dry), out)
	}
	for _, tk := range dry {
		if tk.Result != scheduler.BackfillWould {
			t.Errorf("dry run: tick %v: %q, want %q", tk.Tick, tk.Result, scheduler.BackfillWould)
		}
	}

	// Bad ranges and flags: exit 2, naming what is wrong; nothing enqueued.
	now := time.Now()
	// The refused ranges lie a minute and more in the past: a tick of
	// theirs enqueued would be older than the live scheduler's, which
	// keep coming meanwhile (beside a CPU hog, the refusals took over
	// three of its seconds).
	old := func() int {
		n := 0
		for id := range taskIDs(t, insp) {
			var u int64
			if _, err := fmt.Sscanf(id, "bf:%d", &u); err == nil && time.Unix(u, 0).Before(now.Add(-30*time.Second)) {
				n++
			}
		}
		return n
	}
	before := old()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bf", "--to", rfc(now.Add(-time.Minute))}, "--from is required"},
		{[]string{"bf", "--from", "yesterday", "--to", rfc(now)}, `--from "yesterday" is not an RFC3339 time`},
		{[]string{"bf", "--from", rfc(now.Add(-time.Minute)), "--to", rfc(now.Add(-2 * time.Minute))}, "is after --to"},
		{[]string{"bf", "--from", rfc(now.Add(-time.Minute)), "--to", rfc(now.Add(time.Hour))}, "--to " + rfc(now.Add(time.Hour)) + " is in the future"},
		{[]string{"bf", "--from", rfc(now.Add(-2 * time.Hour)), "--to", rfc(now.Add(-90 * time.Minute))}, "more than task_retention (1h0m0s) ago"},
		{[]string{"bf", "--from", rfc(now.Add(-50 * time.Minute)), "--to", rfc(now.Add(-49 * time.Minute)), "--max", "10"}, "more than --max 10 ticks"},
		{[]string{"bf", "--from", rfc(now.Add(-50 * time.Minute)), "--to", rfc(now.Add(-49 * time.Minute)), "--max", "0"}, "--max must be greater than 0"},
	} {
		code, _, out := r.backfill(c.args...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("backfill %v: exit %d, output %q; want exit 2 and %q", c.args, code, out, c.want)
		}
	}
	if after := old(); after != before {
		t.Errorf("%d tasks of ticks over 30 s old after the refused backfills, %d before", after, before)
	}
	code, _, out = r.backfill("nope", "--from", rfc(now.Add(-time.Minute)), "--to", rfc(now.Add(-time.Minute)))
	if code != 1 || !strings.Contains(out, `no schedule "nope"`) {
		t.Errorf("backfill of no schedule: exit %d, %q; want 1", code, out)
	}
	if n := backfilled(); n != len(enqueued) {
		t.Errorf("lockstep_scheduler_ticks_total{schedule=bf,result=backfilled} summed over the replicas: %d, want %d", n, len(enqueued))
	}
}

// tickCount is lockstep_scheduler_ticks_total{schedule, result} in a
// /metrics body (0 if absent).
func tickCount(t *testing.T, body, schedule, result string) int {
	t.Helper()
	re := regexp.MustCompile(`(?m)^lockstep_scheduler_ticks_total\{result="` + regexp.QuoteMeta(result) +
		`",schedule="` + regexp.QuoteMeta(schedule) + `"\} (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("ticks_total{schedule=%q,result=%q}: %v", schedule, result, err)
	}
	return int(v)
}

// A backfill applies the schedule's overlap policy: with skip and no worker
// to run them, the first tick of the range is enqueued and waits, and the
// others are recorded skipped with reason overlap; so is a trigger.
func TestBackfillAppliesTheOverlapPolicy(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := &overlapRig{t: t, srv: srv, cfg: writeConfig(t, srv.Addr, backfillSchedule)}
	if code, out := r.lockstep("schedules", "add", "hourly", "--cron", "@every 1s", "--task", "test:tick", "--overlap", "skip"); code != 0 {
		t.Fatalf("schedules add: exit %d: %s", code, out)
	}
	if code, out := r.lockstep("schedules", "pause", "hourly"); code != 0 {
		t.Fatalf("schedules pause: exit %d: %s", code, out)
	}
	code, out := r.lockstep("schedules", "--json")
	if code != 0 || !strings.Contains(out, `"overlap": "skip"`) {
		t.Fatalf("schedules --json: exit %d, no overlap skip:\n%s", code, out)
	}
	from := time.Now().Truncate(time.Second).Add(-10 * time.Second)
	code, ticks, out := r.backfill("hourly", "--from", rfc(from), "--to", rfc(from.Add(4*time.Second)), "--json")
	if code != 0 || len(ticks) != 5 {
		t.Fatalf("backfill: exit %d, %d ticks: %s", code, len(ticks), out)
	}
	for i, tk := range ticks {
		want := scheduler.BackfillSkipped
		if i == 0 {
			want = scheduler.BackfillEnqueued
		}
		if tk.Result != want {
			t.Errorf("tick %d (%v): %q, want %q", i, tk.Tick, tk.Result, want)
		}
	}
	// A trigger follows the policy too.
	if code, out := r.lockstep("schedules", "trigger", "hourly"); code != 1 || !strings.Contains(out, "trigger skipped") {
		t.Errorf("trigger behind a queued run: exit %d, %q; want 1, skipped", code, out)
	}
	_, out = r.lockstep("ticks", "hourly", "--json")
	if n := strings.Count(out, `"reason": "overlap"`); n != 5 {
		t.Errorf("lockstep ticks: %d ticks skipped with reason overlap, want 5 (4 backfilled, 1 trigger):\n%s", n, out)
	}
}
