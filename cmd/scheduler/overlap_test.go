package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// overlapWorkerYAML: a worker whose locks (the schedule's run lock too)
// have a 1 s TTL, with debug logs the tests read.
const overlapWorkerYAML = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: debug
lock:
  ttl: 1s
worker:
  concurrency: 2
  shutdown_timeout: 2s
  contention_backoff_min: 10ms
  contention_backoff_max: 200ms
`

// overlapRunTTL is the run lock's TTL: the workers' lock.ttl.
const overlapRunTTL = time.Second

// overlapSchedule is a schedule every second whose runs take 2.5 s.
func overlapSchedule(policy string) string {
	return fmt.Sprintf(`
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: 1s
  task_retention: 1h
schedules:
  - name: nightly
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "nightly", "work_ms": 2500}
    max_retry: 0
    overlap: %s
`, policy)
}

// overlapRig is one Redis (a server, or a Cluster), two scheduler replicas
// and three workers.
type overlapRig struct {
	t        *testing.T
	srv      *redistest.Server
	cluster  *redistest.Cluster // instead of srv
	cfg      string
	replicas []*proc
	workers  []*proc
}

// startOverlapRig starts the rig; setup runs on its Redis before any process.
func startOverlapRig(t *testing.T, policy string, setup ...func(*redistest.Server)) *overlapRig {
	t.Helper()
	srv := redistest.Start(t)
	for _, f := range setup {
		f(srv)
	}
	r := &overlapRig{t: t, srv: srv, cfg: writeConfig(t, srv.Addr, overlapSchedule(policy))}
	r.startProcs()
	return r
}

// redisEnv points a process at the rig's Redis.
func (r *overlapRig) redisEnv() []string {
	if r.cluster != nil {
		return []string{"LOCKSTEP_REDIS_MODE=cluster", "LOCKSTEP_REDIS_ADDRS=" + strings.Join(r.cluster.Addrs(), ",")}
	}
	return []string{"LOCKSTEP_REDIS_ADDR=" + r.srv.Addr}
}

// client is a client of the rig's Redis, closed when the test ends.
func (r *overlapRig) client() redis.UniversalClient {
	if r.cluster != nil {
		return r.cluster.Client()
	}
	return r.srv.Client()
}

// startProcs starts the rig's workers, then its replicas on r.cfg.
func (r *overlapRig) startProcs() {
	t := r.t
	t.Helper()
	wcfg := proctest.WriteFile(t, "worker.yaml", overlapWorkerYAML)
	for i := range 3 {
		w := &proc{t: t}
		w.Proc = proctest.Start(t, proctest.Spec{What: fmt.Sprintf("worker %d", i), Bin: bins["worker"],
			Args: []string{"--config", wcfg}, Output: &w.log,
			Env: append(append(os.Environ(), r.redisEnv()...), "GORACE=atexit_sleep_ms=0")})
		w.waitLog("metrics server listening", 10*time.Second)
		r.workers = append(r.workers, w)
	}
	for range 2 {
		p := startProc(t, nil, "--config", r.cfg, "--http-addr", "127.0.0.1:0")
		p.waitStatus("/readyz", 200, 10*time.Second)
		r.replicas = append(r.replicas, p)
	}
}

// stopReplicas ends the ticks: every replica gets SIGTERM and exits 0.
func (r *overlapRig) stopReplicas() {
	for i, p := range r.replicas {
		if code := p.term(10 * time.Second); code != 0 {
			r.t.Errorf("replica %d: exit code %d", i, code)
		}
	}
}

// cliTick is one tick of `lockstep ticks --json`.
type cliTick struct {
	Tick       time.Time `json:"tick"`
	State      string    `json:"state"`
	Reason     string    `json:"reason"`
	Leader     string    `json:"leader"`
	TaskID     string    `json:"task_id"`
	LatenessMS *int64    `json:"lateness_ms"`
}

// lockstep runs the operator CLI against the rig's Redis and returns its
// exit code and output.
func (r *overlapRig) lockstep(args ...string) (int, string) {
	r.t.Helper()
	var out proctest.Log
	p := proctest.Start(r.t, proctest.Spec{What: "lockstep " + strings.Join(args, " "), Bin: bins["lockstep"], Args: args,
		Output: &out, Env: append(os.Environ(), r.redisEnv()...)})
	code, exited := p.Wait(20 * time.Second)
	if !exited {
		r.t.Fatalf("lockstep %v: still running after 20s", args)
	}
	return code, out.String()
}

// ticks returns the schedule's ticks as `lockstep ticks nightly --json`
// shows them, oldest first.
func (r *overlapRig) ticks() []cliTick {
	r.t.Helper()
	code, out := r.lockstep("ticks", "nightly", "--last", "100", "--json")
	if code != 0 {
		r.t.Fatalf("lockstep ticks: exit %d: %s", code, out)
	}
	var ticks []cliTick
	if err := json.Unmarshal([]byte(out), &ticks); err != nil {
		r.t.Fatalf("lockstep ticks --json: %v\n%s", err, out)
	}
	slices.Reverse(ticks)
	return ticks
}

// executions returns the demo's records of the runs, by task id.
func (r *overlapRig) executions() map[string]demo.Execution {
	r.t.Helper()
	execs, err := demo.ReadExecutions(context.Background(), r.client(), "lockstep:")
	if err != nil {
		r.t.Fatal(err)
	}
	by := map[string]demo.Execution{}
	for _, x := range execs {
		by[x.TaskID] = x
	}
	return by
}

// waitExecutions waits until the demo recorded n runs.
func (r *overlapRig) waitExecutions(n int, timeout time.Duration) {
	r.t.Helper()
	redistest.WaitEvery(r.t, timeout, 100*time.Millisecond, fmt.Sprintf("%d runs recorded", n), func() bool { return len(r.executions()) >= n })
}

// waitIdle waits until every enqueued tick's run has been recorded.
func (r *overlapRig) waitIdle(timeout time.Duration, except ...string) []cliTick {
	r.t.Helper()
	var ticks []cliTick
	var missing []string
	defer func() {
		if len(missing) == 0 { // done, or failed for another reason
			return
		}
		insp := asynq.NewInspectorFromRedisClient(r.client())
		for _, id := range missing {
			info, err := insp.GetTaskInfo("default", id)
			if err == nil {
				r.t.Logf("task %s: asynq state %v, last error %q", id, info.State, info.LastErr)
			}
			for i, w := range r.workers {
				for _, line := range strings.Split(w.output(), "\n") {
					if strings.Contains(line, id) {
						r.t.Logf("worker %d: %s", i, line)
					}
				}
			}
		}
		r.t.Logf("enqueued ticks without a recorded run: %v", missing)
	}()
	redistest.WaitEvery(r.t, timeout, 200*time.Millisecond, "every enqueued tick's run recorded", func() bool {
		var execs map[string]demo.Execution
		ticks, execs = r.ticks(), r.executions()
		missing = missing[:0]
		for _, tk := range ticks {
			if _, ok := execs[tk.TaskID]; tk.State == "done" && !ok && !slices.Contains(except, tk.TaskID) {
				missing = append(missing, tk.TaskID)
			}
		}
		return len(missing) == 0
	})
	return ticks
}

// checkBacklog asserts that every tick is done or skipped with reason
// overlap, that the ticks are consecutive seconds, and that when each tick was
// enqueued at most maxLive earlier runs had not finished (their demo record's
// finished_ms, or ended for a run without one, e.g. its worker killed).
// It returns the enqueued and the skipped ticks.
func checkBacklog(t *testing.T, ticks []cliTick, execs map[string]demo.Execution, maxLive int, ended map[string]time.Time) (done, skipped int) {
	t.Helper()
	type run struct {
		id       string
		enqueued time.Time
		finished time.Time
	}
	var runs []run
	for i, tk := range ticks {
		if i > 0 && tk.Tick.Sub(ticks[i-1].Tick) != time.Second {
			t.Errorf("tick %v follows %v: a tick is neither enqueued nor recorded", tk.Tick, ticks[i-1].Tick)
		}
		switch {
		case tk.State == "done" && tk.LatenessMS != nil:
			done++
			end, ok := ended[tk.TaskID]
			if x, rec := execs[tk.TaskID]; rec {
				end, ok = time.UnixMilli(x.FinishedMS), true
			}
			if !ok {
				t.Fatalf("tick %v (%s): enqueued, no run recorded", tk.Tick, tk.TaskID)
			}
			enq := tk.Tick.Add(time.Duration(*tk.LatenessMS) * time.Millisecond)
			live := 0
			for _, p := range runs {
				if p.finished.After(enq) {
					live++
				}
			}
			if live > maxLive {
				t.Errorf("tick %v enqueued at %v while %d earlier runs had not finished, want at most %d",
					tk.Tick, enq.Format("15:04:05.000"), live, maxLive)
			}
			runs = append(runs, run{tk.TaskID, enq, end})
		case tk.State == "skipped" && tk.Reason == "overlap":
			skipped++
		default:
			t.Errorf("tick %v: state %q reason %q, want done or skipped (overlap)", tk.Tick, tk.State, tk.Reason)
		}
	}
	return done, skipped
}

// With overlap skip, 2 replicas and 3 workers, a tick every second and runs
// of 2.5 s: no tick is enqueued while an earlier run is queued or running,
// every tick is enqueued or recorded skipped (reason overlap), and the
// skips are counted.
func TestOverlapSkipNeverQueuesBehindARun(t *testing.T) {
	t.Parallel()
	r := startOverlapRig(t, "skip")
	r.waitExecutions(3, 20*time.Second)
	r.stopReplicas()
	ticks := r.waitIdle(10 * time.Second)
	done, skipped := checkBacklog(t, ticks, r.executions(), 0, nil)
	if done < 3 || skipped < 4 {
		t.Errorf("%d ticks done, %d skipped; want runs of 2.5s every second to skip about 2 ticks in 3", done, skipped)
	}
	t.Logf("%d ticks: %d enqueued, %d skipped", len(ticks), done, skipped)
}

// With buffer_one, at most one run waits behind the running one.
func TestOverlapBufferOneQueuesAtMostOne(t *testing.T) {
	t.Parallel()
	r := startOverlapRig(t, "buffer_one")
	// lockstep schedules (and the page) show the running run and the one behind it.
	var out string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockstep schedules --json, last seen:\n%s", out)
		}
	})
	redistest.WaitEvery(t, 10*time.Second, 200*time.Millisecond, "lockstep schedules --json to show a running run with one queued", func() bool {
		_, out = r.lockstep("--config", r.cfg, "schedules", "--json")
		return strings.Contains(out, `"running": "nightly:`) && strings.Contains(out, `"queued": 1`) && strings.Contains(out, `"overlap": "buffer_one"`)
	})
	r.waitExecutions(4, 30*time.Second)
	r.stopReplicas()
	ticks := r.waitIdle(15 * time.Second)
	execs := r.executions()
	done, skipped := checkBacklog(t, ticks, execs, 1, nil)
	if done < 4 || skipped < 3 {
		t.Errorf("%d ticks done, %d skipped; want a run waiting behind each", done, skipped)
	}
	for _, x := range demo.Overlaps(slices.Collect(mapValues(execs))) {
		t.Error(x)
	}
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// With cancel_previous, each tick cancels the running run through its lost
// run lock (the tick deleted it) before the new run starts;
// the cancelled runs stop at their context and never commit, fences increase,
// no stale write is accepted, and the last run, which no tick cancels, is done.
func TestOverlapCancelPreviousCancelsTheRunningRun(t *testing.T) {
	t.Parallel()
	r := startOverlapRig(t, "cancel_previous")
	r.waitExecutions(3, 20*time.Second)
	r.stopReplicas()
	ticks := r.waitIdle(15*time.Second, r.endedByLaterTick()...)
	execs := r.executions()
	var runs []demo.Execution
	for _, tk := range ticks {
		if tk.State != "done" {
			t.Errorf("tick %v: state %q reason %q, want done", tk.Tick, tk.State, tk.Reason)
		}
		if x, ok := execs[tk.TaskID]; ok {
			runs = append(runs, x)
		}
	}
	for _, err := range demo.Overlaps(runs) {
		t.Error(err)
	}
	for i, x := range runs {
		last := i == len(runs)-1
		switch {
		case last && x.Outcome != demo.OutcomeOK:
			t.Errorf("last run %s: outcome %q, want ok", x.TaskID, x.Outcome)
		case !last && x.Outcome != demo.OutcomeLockLost:
			t.Errorf("run %s, followed by %s: outcome %q, want lock_lost (cancelled)", x.TaskID, runs[i+1].TaskID, x.Outcome)
		case !last && x.FinishedMS > runs[i+1].StartedMS:
			t.Errorf("run %s ended at %d, after the next run started at %d", x.TaskID, x.FinishedMS, runs[i+1].StartedMS)
		}
	}
	writes, err := demo.ReadWrites(context.Background(), r.srv.Client(), "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range demo.StaleWrites(writes) {
		t.Error(err)
	}
	lost := 0
	causes := map[string]string{} // a cancelled run's task id -> its context's cause
	for _, w := range r.workers {
		for _, line := range strings.Split(w.output(), "\n") {
			// The tick deleted the run lock: its watchdog sees the key gone.
			if strings.Contains(line, "lock lost") && strings.Contains(line, `"key":"schedule:nightly"`) {
				lost++
			}
			// The demo handler returns its context's cause (context.Cause).
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "job finished" && rec["type"] == demo.Type {
				id, _ := rec["id"].(string)
				causes[id], _ = rec["err"].(string)
			}
		}
	}
	// Each cancelled run's context ends with a cause that names the tick
	// that cancelled it: one after the run's own, at or before the next run's.
	cancelledBy := regexp.MustCompile(`^schedule nightly: run (nightly:\d+) cancelled by tick nightly:(\d+) at \S+ \(overlap cancel_previous\): lock lost: schedule:nightly: (expired|stolen)$`)
	for i, x := range runs[:max(len(runs)-1, 0)] {
		m := cancelledBy.FindStringSubmatch(causes[x.TaskID])
		if m == nil || m[1] != x.TaskID {
			t.Errorf("run %s: cause %q, want one naming the tick that cancelled it", x.TaskID, causes[x.TaskID])
			continue
		}
		by, _ := strconv.ParseInt(m[2], 10, 64)
		if own, next := tickUnix(x.TaskID), tickUnix(runs[i+1].TaskID); by <= own || by > next {
			t.Errorf("run %s: cancelled by tick %d, want one in (%d, %d]", x.TaskID, by, own, next)
		}
	}
	ended := 0
	for _, w := range r.workers {
		ended += strings.Count(w.output(), "schedule run ended by a later tick while it ran")
	}
	if ended < len(runs)-1 {
		t.Errorf("%d workers' runs told they were ended by a later tick, want %d", ended, len(runs)-1)
	}
	if len(runs) < 3 || lost < len(runs)-1 {
		t.Errorf("%d runs, %d run locks lost; want each tick to cancel the run before", len(runs), lost)
	}
}

// tickUnix is the tick, Unix seconds, in a tick's task id "<schedule>:<unix>".
func tickUnix(id string) int64 {
	u, _ := strconv.ParseInt(id[strings.LastIndexByte(id, ':')+1:], 10, 64)
	return u
}

// endedByLaterTick returns the tasks that a worker did not run because a
// later tick had ended their run.
func (r *overlapRig) endedByLaterTick() []string {
	var ids []string
	for _, w := range r.workers {
		for _, line := range strings.Split(w.output(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "schedule run ended by a later tick; task not run" {
				id, _ := rec["id"].(string)
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// G9 under a fault: with skip, and with buffer_one, the worker of the
// running run is SIGKILLed mid-run. No run starts while its run lock lives,
// the next run starts within the run lock's TTL (and a tick, and a lock
// wait's backoff) of the kill, and the backlog stays within the policy.
func TestOverlapWorkerKilledMidRunNextRunWithinTTL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		policy  string
		maxLive int
	}{{"skip", 0}, {"buffer_one", 1}} {
		t.Run(c.policy, func(t *testing.T) { killMidRun(t, c.policy, c.maxLive) })
	}
}

func killMidRun(t *testing.T, policy string, maxLive int) {
	r := startOverlapRig(t, policy)
	var victim *proc
	var id string
	redistest.WaitFor(t, 15*time.Second, "a schedule run started", func() bool {
		for _, w := range r.workers {
			if rec := w.log.Find(proctest.Msg("schedule run started")); rec != nil {
				victim, id = w, rec["id"].(string)
			}
		}
		return victim != nil
	})
	victim.Kill()
	killed := time.Now()
	t.Logf("killed the worker of %s", id)

	// The first run that started after the kill.
	var next demo.Execution
	redistest.WaitEvery(t, 10*time.Second-time.Since(killed), 100*time.Millisecond, "a run started after the kill", func() bool {
		for _, x := range r.executions() {
			if started := time.UnixMilli(x.StartedMS); started.After(killed) && (next.TaskID == "" || x.StartedMS < next.StartedMS) {
				next = x
			}
		}
		return next.TaskID != ""
	})
	started := time.UnixMilli(next.StartedMS)
	// The run lock was renewed every TTL/3: it lived at least 2/3 TTL after
	// the kill, and at most TTL.
	if lo := killed.Add(2 * overlapRunTTL / 3); started.Before(lo) {
		t.Errorf("run %s started %v after the kill, while the killed run's lock still lived", next.TaskID, started.Sub(killed))
	}
	if hi := killed.Add(overlapRunTTL + 2*time.Second); started.After(hi) { // a tick, a poll, a loaded machine
		t.Errorf("run %s started %v after the kill, want within the run lock's TTL %v and a tick", next.TaskID, started.Sub(killed), overlapRunTTL)
	}
	t.Logf("next run %s started %v after the kill", next.TaskID, started.Sub(killed).Round(time.Millisecond))
	r.waitExecutions(3, 15*time.Second)
	r.stopReplicas()
	ticks := r.waitIdle(15*time.Second, id)
	checkBacklog(t, ticks, r.executions(), maxLive, map[string]time.Time{id: killed.Add(2 * overlapRunTTL / 3)})
}

// A schedule's run whose handler's lock is busy (another job holds the
// order) waits for it in its worker, under the run lock, rather than being
// requeued, so that no hand-off runs it elsewhere without its run lock; it
// starts in that worker on its first attempt once the order is free.
func TestOverlapRunWaitsForItsHandlersLockUnderTheRunLock(t *testing.T) {
	t.Parallel()
	var other *lock.Lease
	r := startOverlapRig(t, "skip", func(srv *redistest.Server) {
		var err error
		if other, err = lock.New(srv.Client()).TryAcquire(context.Background(), demo.Resource("nightly"), time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	var w *proc
	var id string
	redistest.WaitFor(t, 15*time.Second, "a schedule run waiting in its worker for the busy order lock", func() bool {
		for _, p := range r.workers {
			if rec := p.log.Find(proctest.Msg("lock busy; task waits in the worker")); rec != nil {
				w, id = p, rec["id"].(string)
			}
		}
		return w != nil
	})
	code, out := r.lockstep("locks", "--json")
	if code != 0 || !strings.Contains(out, `"resource": "schedule:nightly"`) || !strings.Contains(out, id) {
		t.Errorf("lockstep locks: exit %d; want schedule:nightly held by %s:\n%s", code, id, out)
	}
	if err := other.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := w.waitLog("job started", 10*time.Second)
	if rec["id"] != id {
		t.Fatalf("the worker that waited started %v, want %s", rec["id"], id)
	}
	if rec["attempt"] != float64(1) {
		t.Errorf("%s started on attempt %v, want 1 (never requeued)", id, rec["attempt"])
	}
	r.waitExecutions(1, 10*time.Second)
	if x := r.executions()[id]; x.Outcome != demo.OutcomeOK || x.Worker == "" {
		t.Errorf("run %s: %+v, want ok", id, x)
	}
}
