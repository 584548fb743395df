package chaos

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// clean is a history with nothing wrong in it: two orders, a redelivery
// explained by a worker killed after its handler returned, a takeover, and
// a Redis pause during which two runs overlap.
func clean() History {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	return History{
		Seed: 7, Start: t0, End: at(60_000), LockTTL: 2 * time.Second,
		ExecutionsComplete: true, WritesAvailable: true, WritesComplete: true, ReplicaLogsComplete: true, RatedComplete: true,
		Executions: []Execution{
			{OrderID: "1", Fence: 10, Worker: "h:1", TaskID: "j1", Started: at(0), Finished: at(100), Outcome: "ok"},
			{OrderID: "1", Fence: 11, Worker: "h:2", TaskID: "j2", Started: at(100), Finished: at(300), Outcome: "ok"},
			{OrderID: "1", Fence: 12, Worker: "h:2", TaskID: "j1", Started: at(2000), Finished: at(2100), Outcome: "ok"}, // h:1 killed at 150
			{OrderID: "2", Fence: 5, Worker: "h:1", TaskID: "j3", Started: at(0), Finished: at(900), Outcome: "lock_lost"},
			{OrderID: "2", Fence: 6, Worker: "h:2", TaskID: "j3", Started: at(500), Finished: at(700), Outcome: "ok"},
			// Redis paused from 10s to 14s: these two overlap, and are put down to it.
			{OrderID: "2", Fence: 7, Worker: "h:2", TaskID: "j4", Started: at(9000), Finished: at(14_500), Outcome: "ok"},
			{OrderID: "2", Fence: 8, Worker: "h:3", TaskID: "j5", Started: at(14_400), Finished: at(14_600), Outcome: "ok"},
		},
		Writes: []Write{
			{OrderID: "1", Fence: 10, Op: "begin", TaskID: "j1", At: at(1)},
			{OrderID: "1", Fence: 10, Op: "commit", TaskID: "j1", At: at(99)},
			{OrderID: "1", Fence: 11, Op: "begin", TaskID: "j2", At: at(101)},
			{OrderID: "1", Fence: 11, Op: "commit", TaskID: "j2", At: at(299)},
		},
		// Client c1's quota (2 a second, burst 2): a burst of 2, then one
		// each 500ms, each starting a little after its admission.
		RatedStarts: []RatedStart{
			{Client: "c1", TaskID: "k1", Admitted: at(1000), Started: at(1003)},
			{Client: "c1", TaskID: "k2", Admitted: at(1001), Started: at(1010)},
			{Client: "c1", TaskID: "k3", Admitted: at(1500), Started: at(1502)},
			{Client: "c1", TaskID: "k4", Admitted: at(2000), Started: at(2600)},
			{Client: "c2", TaskID: "k5", Admitted: at(2000), Started: at(2001)},
		},
		Jobs: []Job{
			{ID: "j1", OrderID: "1", Acked: true, State: "completed"},
			{ID: "j2", OrderID: "1", Acked: true, State: "completed"},
			{ID: "j3", OrderID: "2", Acked: true, State: "completed"},
			{ID: "j9", OrderID: "2", Acked: false, State: ""}, // the enqueue failed: not checked
		},
		Claims: []TickEvent{
			{Replica: "a", Schedule: "s", Tick: 100, Kind: "on_time", At: at(0)},
			{Replica: "b", Schedule: "s", Tick: 101, Kind: "on_time", At: at(1000)},
			{Replica: "c", Schedule: "s", Tick: 101, Kind: "takeover", At: at(4000)}, // b died after claiming
		},
		Enqueues: []TickEvent{
			{Replica: "a", Schedule: "s", Tick: 100, Kind: "on_time", Result: "enqueued", At: at(5)},
			{Replica: "c", Schedule: "s", Tick: 101, Kind: "takeover", Result: "enqueued", At: at(4005)},
		},
		// Tick 99 has no task: its winner skipped it (overlap), which is no missing tick.
		Skips: []TickEvent{{Replica: "a", Schedule: "s", Tick: 99, Kind: "on_time", At: at(-1000)}},
		Ticks: []Tick{{Schedule: "s", Tick: 99, State: ""}, {Schedule: "s", Tick: 100, State: "completed"}, {Schedule: "s", Tick: 101, State: "pending"}},
		Faults: []Fault{
			{Kind: FaultWorkerKill, Target: "worker-1", Worker: "h:1", Start: at(150), End: at(1000)},
			{Kind: FaultRedisPauseLong, Target: "redis", Start: at(10_000), End: at(14_000)},
		},
	}
}

func TestCheckCleanHistory(t *testing.T) {
	r := Check(clean())
	if v := r.Violations(); v != 0 {
		t.Fatalf("%d violations in a clean history: %+v", v, r.Evidence)
	}
	if r.JobsCompletedTwiceExplained != 1 || r.OverlapsRedisUnhealthy != 1 || r.TicksTakenOver != 1 || r.JobsUnacked != 1 || r.TicksSkippedOverlap != 1 {
		t.Errorf("explained counts: twice %d, overlaps while Redis was paused %d, takeovers %d, unacked %d, skipped by overlap %d; want 1 each",
			r.JobsCompletedTwiceExplained, r.OverlapsRedisUnhealthy, r.TicksTakenOver, r.JobsUnacked, r.TicksSkippedOverlap)
	}
	if r.StaleWritesAccepted != 0 || len(r.NotChecked) != 0 {
		t.Errorf("stale writes %d, not checked %q", r.StaleWritesAccepted, r.NotChecked)
	}
	if r.Faults[FaultWorkerKill] != 1 || r.Faults[FaultRedisPauseLong] != 1 {
		t.Errorf("faults %v", r.Faults)
	}
}

// Fed a history with an overlap, a stale write, a lost job, a task completed
// twice with no kill to explain it, a tick claimed by two replicas, a tick
// enqueued afresh by two and a tick without a task, the checker reports
// each, once.
func TestCheckFindsEachViolation(t *testing.T) {
	h := clean()
	t0 := h.Start
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h.Executions = append(h.Executions,
		// order 1: j6 starts while j7 still runs, Redis healthy.
		Execution{OrderID: "1", Fence: 20, Worker: "h:3", TaskID: "j6", Started: at(30_000), Finished: at(30_500), Outcome: "ok"},
		Execution{OrderID: "1", Fence: 21, Worker: "h:2", TaskID: "j7", Started: at(30_200), Finished: at(30_600), Outcome: "ok"},
		// j2 again, and h:2 (which ran it first) was never killed.
		Execution{OrderID: "1", Fence: 22, Worker: "h:3", TaskID: "j2", Started: at(40_000), Finished: at(40_100), Outcome: "ok"},
	)
	h.Writes = append(h.Writes,
		Write{OrderID: "1", Fence: 21, Op: "begin", TaskID: "j7", At: at(30_201)},
		Write{OrderID: "1", Fence: 20, Op: "commit", TaskID: "j6", At: at(30_499)}, // stale: 21 had begun
		Write{OrderID: "1", Fence: 21, Op: "commit", TaskID: "j7", At: at(30_599)},
	)
	h.Jobs = append(h.Jobs, Job{ID: "j8", OrderID: "3", Acked: true, State: ""})
	h.Claims = append(h.Claims,
		TickEvent{Replica: "a", Schedule: "s", Tick: 102, Kind: "on_time", At: at(2000)},
		TickEvent{Replica: "b", Schedule: "s", Tick: 102, Kind: "on_time", At: at(2001)},
	)
	h.Enqueues = append(h.Enqueues, // both enqueue it afresh: a second task id would run it twice
		TickEvent{Replica: "a", Schedule: "s", Tick: 102, Kind: "on_time", Result: "enqueued", At: at(2005)},
		TickEvent{Replica: "b", Schedule: "s", Tick: 102, Kind: "catch_up", Result: "caught_up", At: at(2006)},
	)
	h.Ticks = append(h.Ticks, Tick{Schedule: "s", Tick: 102, State: "completed"}, Tick{Schedule: "s", Tick: 103, State: ""})

	r := Check(h)
	for name, got := range map[string]int{
		"overlaps":                         r.Overlaps,
		"stale_writes_accepted":            r.StaleWritesAccepted,
		"jobs_lost":                        r.JobsLost,
		"jobs_completed_twice_unexplained": r.JobsCompletedTwiceUnexplained,
		"ticks_claimed_twice":              r.TicksClaimedTwice,
		"ticks_enqueued_twice":             r.TicksEnqueuedTwice,
		"ticks_missing":                    r.TicksMissing,
	} {
		if got != 1 {
			t.Errorf("%s = %d, want 1", name, got)
		}
	}
	checks := map[string]int{}
	for _, v := range r.Evidence {
		checks[v.Check]++
	}
	if len(r.Evidence) != 7 || len(checks) != 7 {
		t.Errorf("evidence %d lines over %d checks, want 7 and 7: %+v", len(r.Evidence), len(checks), r.Evidence)
	}
	if r.Violations() != 7 {
		t.Errorf("violations %d, want 7", r.Violations())
	}
}

// G11 in the chaos run: starts of one client admitted closer than its quota
// allows are over-grants, each counted once at the window it opens; a start
// with no admission is one too; another client's starts are its own.
func TestCheckRateOverGrants(t *testing.T) {
	h := clean()
	if r := Check(h); r.RateOverGrants != 0 || r.RatedStarts != 5 || r.RatedStartLagMaxMS != 600 || r.RatedMaxInWindow > 1 {
		t.Fatalf("clean: over-grants %d, starts %d, lag %dms, fullest window %.2f; want 0, 5, 600ms, ≤ 1",
			r.RateOverGrants, r.RatedStarts, r.RatedStartLagMaxMS, r.RatedMaxInWindow)
	}
	at := func(ms int) time.Time { return h.Start.Add(time.Duration(ms) * time.Millisecond) }
	h.RatedStarts = append(h.RatedStarts,
		RatedStart{Client: "c1", TaskID: "k6", Admitted: at(2100), Started: at(2101)}, // 2000 and 2100: 100ms after a turn used up
		RatedStart{Client: "c2", TaskID: "k7", Admitted: at(2100), Started: at(2101)}, // c2's second: within its burst
		RatedStart{Client: "c2", TaskID: "k8", Started: at(3000)},                     // no admission
	)
	r := Check(h)
	if r.RateOverGrants != 2 || r.Violations() != 2 {
		t.Fatalf("over-grants %d, violations %d; want 2 (k6's window, k8 unadmitted): %+v", r.RateOverGrants, r.Violations(), r.Evidence)
	}
	h.RatedComplete = false
	if r := Check(h); !slices.ContainsFunc(r.NotChecked, func(s string) bool { return strings.HasPrefix(s, "rate_over_grants") }) {
		t.Fatalf("not checked %q: want the incomplete stream named", r.NotChecked)
	}
}

// A stale commit is found only in stream order: the same writes with the
// stale commit before the higher begin are fine.
func TestCheckStaleWriteIsOrderSensitive(t *testing.T) {
	h := clean()
	h.Writes = []Write{
		{OrderID: "1", Fence: 20, Op: "begin"}, {OrderID: "1", Fence: 20, Op: "commit"},
		{OrderID: "1", Fence: 21, Op: "begin"}, {OrderID: "1", Fence: 21, Op: "commit"},
	}
	if r := Check(h); r.StaleWritesAccepted != 0 {
		t.Errorf("in order: stale_writes_accepted = %d, want 0", r.StaleWritesAccepted)
	}
	h.Writes[1], h.Writes[2] = h.Writes[2], h.Writes[1]
	if r := Check(h); r.StaleWritesAccepted != 1 {
		t.Errorf("commit 20 after begin 21: stale_writes_accepted = %d, want 1", r.StaleWritesAccepted)
	}
}

// Missing sources are reported as not available (-1) or incomplete, never as 0.
func TestCheckReportsWhatItCouldNotCheck(t *testing.T) {
	h := clean()
	h.Writes, h.WritesAvailable = nil, false
	h.ExecutionsComplete = false
	h.Jobs = append(h.Jobs, Job{ID: "j10", Acked: true, State: "retry"})
	r := Check(h)
	if r.StaleWritesAccepted != NotAvailable {
		t.Errorf("stale_writes_accepted = %d without a write log, want %d", r.StaleWritesAccepted, NotAvailable)
	}
	if r.JobsUnfinished != 1 || r.JobsLost != 0 {
		t.Errorf("unfinished %d, lost %d; want 1, 0", r.JobsUnfinished, r.JobsLost)
	}
	if len(r.NotChecked) != 4 { // executions, writes, an unfinished job, recovery_ms (no writes to see what ran)
		t.Errorf("not checked: %q, want 4 lines", r.NotChecked)
	}

	dir := t.TempDir()
	if err := WriteReport(dir, r, h, "make chaos SEED=7"); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	b, err := os.ReadFile(filepath.Join(dir, ReportJSON))
	if err != nil || json.Unmarshal(b, &got) != nil {
		t.Fatalf("report json: %v\n%s", err, b)
	}
	for _, k := range []string{"overlaps", "stale_writes_accepted", "jobs_lost", "jobs_completed_twice_unexplained", "ticks_claimed_twice", "ticks_missing", "recovery_over_bound", "seed"} {
		if _, ok := got[k].(float64); !ok {
			t.Errorf("report json: %s = %v, want an integer", k, got[k])
		}
	}
	if f, ok := got["faults"].(map[string]any); !ok || f[FaultWorkerKill] != float64(1) {
		t.Errorf("report json: faults = %v", got["faults"])
	}
	md, _ := os.ReadFile(filepath.Join(dir, ReportMarkdown))
	for _, want := range []string{"| `stale_writes_accepted` | G5 | not available |", "make chaos SEED=7", "## Not checked or incomplete"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report markdown lacks %q:\n%s", want, md)
		}
	}
}

// One run recorded twice (the record's XADD retried after a timeout hid its
// success: same task, same fence) is not a second run; a second ok run of
// the task (another fence) with no kill in between still is.
func TestCheckDuplicatedRecordIsOneRun(t *testing.T) {
	h := clean()
	dup := h.Executions[1] // j2, fence 11, recorded again as it was
	h.Executions = append(h.Executions, dup)
	r := Check(h)
	if v := r.Violations(); v != 0 || r.ExecutionRecordsDuplicated != 1 {
		t.Fatalf("violations %d, duplicated records %d; want 0 and 1: %+v", v, r.ExecutionRecordsDuplicated, r.Evidence)
	}
	again := dup
	again.Fence = 99
	again.Started, again.Finished = again.Started.Add(10*time.Second), again.Finished.Add(10*time.Second)
	h.Executions = append(h.Executions, again)
	if r := Check(h); r.JobsCompletedTwiceUnexplained != 1 {
		t.Fatalf("a second run with another fence: unexplained %d, want 1", r.JobsCompletedTwiceUnexplained)
	}
}

// A second ok run of a task whose first completion asynq logged it could
// not record (Redis down or loading when the handler returned) is asynq's
// at-least-once, explained as a kill after the handler is; the same log
// line for another task, or one from before the first run ended, explains
// nothing.
func TestCheckCompletionNotRecordedExplainsARerun(t *testing.T) {
	h := clean()
	first := h.Executions[1] // j2
	again := first
	again.Fence = 99
	again.Started, again.Finished = first.Finished.Add(40*time.Second), first.Finished.Add(41*time.Second)
	h.Executions = append(h.Executions, again)

	line := `{"time":"` + first.Finished.Add(900*time.Millisecond).UTC().Format(time.RFC3339Nano) + `","level":"WARN",` +
		`"msg":"Could not move task id=` + first.TaskID + ` type=\"demo:order.pay\" from \"asynq:{default}:active\" to \"asynq:{default}:completed\":  INTERNAL_ERROR: redis eval error: LOADING Redis is loading the dataset in memory; Will retry syncing","component":"asynq"}`
	other := strings.Replace(line, "id="+first.TaskID+" ", "id=elsewhere ", 1)
	early := strings.Replace(line, first.Finished.Add(900*time.Millisecond).UTC().Format(time.RFC3339Nano),
		first.Started.Add(-5*time.Second).UTC().Format(time.RFC3339Nano), 1)

	for _, c := range []struct {
		name, log   string
		unexplained int
	}{
		{"no log line", "", 1},
		{"another task's", other, 1},
		{"before the first run ended", early, 1},
		{"the first completion's", line, 0},
	} {
		h := h
		h.CompletionsNotRecorded = nil
		if err := ReadWorkerLog(strings.NewReader("not json\n"+c.log+"\n"), &h); err != nil {
			t.Fatal(err)
		}
		if r := Check(h); r.JobsCompletedTwiceUnexplained != c.unexplained {
			t.Errorf("%s: unexplained %d, want %d", c.name, r.JobsCompletedTwiceUnexplained, c.unexplained)
		}
	}
}

// A worker frozen past the lock TTL just after its handler returned, before
// anything recorded the result, is judged dead as a killed one is, and its
// task runs again elsewhere while it is frozen: asynq's at-least-once,
// explained when the frozen worker logs, once resumed, that asynq could not
// record the first completion. Without that line, or with a short pause, or
// a long pause of another worker, the rerun stays unexplained.
func TestCheckFrozenWorkersUnrecordedCompletionExplainsARerun(t *testing.T) {
	h := clean()
	first := h.Executions[1] // j2
	again := first
	again.Fence, again.Worker = 99, "h:9"
	again.Started, again.Finished = first.Finished.Add(1800*time.Millisecond), first.Finished.Add(1900*time.Millisecond)
	h.Executions = append(h.Executions, again)
	pause := func(kind, worker string) Fault {
		return Fault{Kind: kind, Target: "worker-1", Worker: worker, Start: first.Finished.Add(5 * time.Millisecond), End: first.Finished.Add(3 * time.Second)}
	}
	line := `{"time":"` + first.Finished.Add(3010*time.Millisecond).UTC().Format(time.RFC3339Nano) + `","level":"WARN",` +
		`"msg":"Could not move task id=` + first.TaskID + ` type=\"demo:order.pay\" from \"asynq:{default}:active\" to \"asynq:{default}:completed\":  INTERNAL_ERROR: redis eval error: NOT FOUND; Will retry syncing","component":"asynq"}`
	for _, c := range []struct {
		name        string
		fault       Fault
		log         string
		unexplained int
	}{
		{"frozen past the TTL, the completion not recorded", pause(FaultWorkerPauseLong, first.Worker), line, 0},
		{"frozen past the TTL, no log line", pause(FaultWorkerPauseLong, first.Worker), "", 1},
		{"a short pause", pause(FaultWorkerPauseShort, first.Worker), line, 1},
		{"another worker frozen", pause(FaultWorkerPauseLong, "h:7"), line, 1},
	} {
		h := h
		h.Faults = append(slices.Clone(h.Faults), c.fault)
		h.CompletionsNotRecorded = nil
		if err := ReadWorkerLog(strings.NewReader("not json\n"+c.log+"\n"), &h); err != nil {
			t.Fatal(err)
		}
		if r := Check(h); r.JobsCompletedTwiceUnexplained != c.unexplained {
			t.Errorf("%s: unexplained %d, want %d", c.name, r.JobsCompletedTwiceUnexplained, c.unexplained)
		}
	}
}

// A tenant's syncs (limit 3) may run 3 at once, on 3 permits; a fourth at
// once is over_limit, two on one permit an overlap, and a stale write on a
// permit is found per (tenant, permit). A fourth during a Redis pause is
// not counted.
func TestCheckPermits(t *testing.T) {
	h := clean()
	t0 := h.Start
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sync := func(task string, permit int, fence int64, from, to int) Execution {
		return Execution{TenantID: "t1", Permit: permit, Fence: fence, Worker: "h:1", TaskID: task, Started: at(from), Finished: at(to), Outcome: "ok"}
	}
	h.Executions = append(h.Executions,
		sync("s1", 0, 10, 20_000, 20_500), sync("s2", 1, 11, 20_000, 20_500), sync("s3", 2, 12, 20_000, 20_500),
		sync("s4", 0, 13, 20_500, 21_000), // handed permit 0 on as s1 ended: fine
	)
	h.Writes = append(h.Writes,
		Write{OrderID: "tenant t1/0", Fence: 10, Op: "begin", TaskID: "s1", At: at(20_001)},
		Write{OrderID: "tenant t1/1", Fence: 11, Op: "begin", TaskID: "s2", At: at(20_002)},
		Write{OrderID: "tenant t1/0", Fence: 10, Op: "commit", TaskID: "s1", At: at(20_499)}, // permit 1's higher fence is no matter
	)
	if r := Check(h); r.Violations() != 0 || r.OverLimit != 0 || r.TenantSyncs != 4 || r.TenantMaxAtOnce != 3 {
		t.Fatalf("a clean tenant history: %d violations, over_limit %d: %+v", r.Violations(), r.OverLimit, r.Evidence)
	}
	h.Executions = append(h.Executions,
		sync("s5", 1, 14, 20_100, 20_400), // a 4th at once, and a 2nd on permit 1
	)
	h.Writes = append(h.Writes, Write{OrderID: "tenant t1/1", Fence: 9, Op: "commit", TaskID: "old", At: at(20_600)})
	r := Check(h)
	if r.OverLimit != 1 || r.Overlaps != 1 || r.StaleWritesAccepted != 1 || r.Violations() != 3 {
		t.Fatalf("over_limit %d, overlaps %d, stale %d, violations %d; want 1, 1, 1, 3: %+v",
			r.OverLimit, r.Overlaps, r.StaleWritesAccepted, r.Violations(), r.Evidence)
	}
}

// A recovery of a worker is a violation unless a fault had stopped that
// worker: killed at any time before, or paused or cut off until just before.
func TestCheckRecoveriesFromLiveWorkers(t *testing.T) {
	h := clean()
	t0 := h.Start
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h.Faults = append(h.Faults,
		Fault{Kind: FaultWorkerKill, Worker: "h:1", Start: at(1_000), End: at(3_000)},
		Fault{Kind: FaultWorkerPauseLong, Worker: "h:2", Start: at(5_000), End: at(9_000)},
	)
	line := func(ms int, id, dead string) string {
		return `{"time":"` + at(ms).UTC().Format(time.RFC3339Nano) + `","level":"INFO","msg":"dead worker's task recovered: its lock expired; back at the head of its queue","id":"` +
			id + `","type":"demo:order.pay","resource":"lock:order:1","worker":"` + dead + `"}`
	}
	for _, c := range []struct {
		name, log string
		live      int
	}{
		{"of a killed worker, long after", line(40_000, "a", "h:1"), 0},
		{"of a paused worker, as it resumed", line(9_500, "b", "h:2"), 0},
		{"of a killed worker, before the kill", line(100, "c", "h:1"), 1},
		{"of a paused worker, long after it resumed", line(15_000, "d", "h:2"), 1},
		{"of a worker no fault touched", line(6_000, "e", "h:3"), 1},
	} {
		h := h
		h.Recoveries = nil
		if err := ReadWorkerLog(strings.NewReader("not json\n"+c.log+"\n"), &h); err != nil {
			t.Fatal(err)
		}
		if len(h.Recoveries) != 1 {
			t.Fatalf("%s: read %d recoveries, want 1", c.name, len(h.Recoveries))
		}
		if r := Check(h); r.RecoveredFromLive != c.live || r.Violations() != c.live {
			t.Errorf("%s: recovered_from_live_workers %d (violations %d), want %d", c.name, r.RecoveredFromLive, r.Violations(), c.live)
		}
	}
}

// recovery_ms: the tasks a killed worker was running (begun, not ended by
// it) are timed from the kill to their next start; one later than the lock
// TTL + 3 s is a violation. A task the worker had finished is not counted.
func TestCheckRecoveryTimes(t *testing.T) {
	h := clean()
	h.LockTTL = 2 * time.Second
	at := func(ms int) time.Time { return h.Start.Add(time.Duration(ms) * time.Millisecond) }
	h.Writes = append(h.Writes,
		Write{OrderID: "7", Fence: 20, Op: "begin", TaskID: "k1", Worker: "h:1", At: at(120)},
		Write{OrderID: "8", Fence: 21, Op: "begin", TaskID: "k2", Worker: "h:1", At: at(140)},
		Write{OrderID: "9", Fence: 22, Op: "begin", TaskID: "k3", Worker: "h:1", At: at(50)},
	)
	h.Executions = append(h.Executions,
		Execution{OrderID: "9", Fence: 22, Worker: "h:1", TaskID: "k3", Started: at(50), Finished: at(140), Outcome: "ok"},
		Execution{OrderID: "7", Fence: 30, Worker: "h:2", TaskID: "k1", Started: at(1650), Finished: at(1700), Outcome: "ok"},
		Execution{OrderID: "8", Fence: 31, Worker: "h:2", TaskID: "k2", Started: at(6150), Finished: at(6200), Outcome: "ok"},
	)
	h.Jobs = append(h.Jobs, Job{ID: "k1", OrderID: "7", Acked: true, State: "completed"},
		Job{ID: "k2", OrderID: "8", Acked: true, State: "completed"}, Job{ID: "k3", OrderID: "9", Acked: true, State: "completed"})
	// A schedule's tick task (not the producer's) cut off by the same kill,
	// back late: timed, not bounded.
	h.Writes = append(h.Writes, Write{OrderID: "t", Fence: 23, Op: "begin", TaskID: "s:100", Worker: "h:1", At: at(130)})
	h.Executions = append(h.Executions, Execution{OrderID: "t", Fence: 32, Worker: "h:2", TaskID: "s:100", Started: at(20_150), Finished: at(20_200), Outcome: "ok"})
	r := Check(h)
	got := r.RecoveryMS[FaultWorkerKill]
	if got == nil || got.Tasks != 3 || got.P50 != 6000 || got.Max != 20_000 {
		t.Fatalf("recovery_ms[worker_kill] = %+v, want 3 tasks, p50 6000 ms, max 20000 ms", got)
	}
	if r.RecoveryOverBound != 1 || r.Violations() != 1 {
		t.Errorf("recovery_over_bound %d (violations %d), want 1 (k2 came back 6 s after the kill, over 2 s + 3 s), a violation", r.RecoveryOverBound, r.Violations())
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"recovery_ms":{"worker_kill":{"p50":6000,"max":20000,"tasks":3}}`) {
		t.Errorf("report JSON lacks recovery_ms as DESIGN names it: %s", b)
	}
}

// recovery_ms counts only the tasks in the killed worker's hands at the
// kill: asynq had them active (its Inspector, read right after the kill, or
// once a drained worker has exited),
// and the worker's begin was their latest. A run whose end was never
// recorded (Redis was away when it wrote it) and that asynq retried later,
// or a task that another worker began after it, is not timed from the kill.
func TestCheckRecoveryTimesCountsOnlyTheKilledWorkersTasks(t *testing.T) {
	h := clean()
	h.LockTTL = 2 * time.Second
	at := func(ms int) time.Time { return h.Start.Add(time.Duration(ms) * time.Millisecond) }
	kill := Fault{Kind: FaultWorkerKill, Target: "worker-1", Worker: "h:1", Start: at(10_000), End: at(11_000)}
	h.Writes = append(h.Writes,
		// r1: h:1's run ended unrecorded at 1 s; asynq retried it 20 s later.
		Write{OrderID: "41", Fence: 110, Op: "begin", TaskID: "r1", Worker: "h:1", At: at(500)},
		// r2: begun by h:1, lost, begun again by h:2 before the kill.
		Write{OrderID: "42", Fence: 111, Op: "begin", TaskID: "r2", Worker: "h:1", At: at(600)},
		Write{OrderID: "42", Fence: 112, Op: "begin", TaskID: "r2", Worker: "h:2", At: at(9_000)},
		// r3: in h:1's hands at the kill, back late.
		Write{OrderID: "43", Fence: 113, Op: "begin", TaskID: "r3", Worker: "h:1", At: at(9_500)},
	)
	h.Executions = append(h.Executions,
		Execution{OrderID: "41", Fence: 120, Worker: "h:2", TaskID: "r1", Started: at(30_000), Finished: at(30_100), Outcome: "ok"},
		Execution{OrderID: "42", Fence: 112, Worker: "h:2", TaskID: "r2", Started: at(8_900), Finished: at(10_500), Outcome: "lock_lost"},
		Execution{OrderID: "42", Fence: 121, Worker: "h:3", TaskID: "r2", Started: at(40_000), Finished: at(40_100), Outcome: "ok"},
		Execution{OrderID: "43", Fence: 122, Worker: "h:2", TaskID: "r3", Started: at(25_000), Finished: at(25_100), Outcome: "ok"},
	)
	h.Jobs = append(h.Jobs, Job{ID: "r1", OrderID: "41", Acked: true, State: "completed"},
		Job{ID: "r2", OrderID: "42", Acked: true, State: "completed"}, Job{ID: "r3", OrderID: "43", Acked: true, State: "completed"})
	for _, c := range []struct {
		name   string
		kind   string
		active []string
		tasks  int
		over   int
	}{
		{"asynq's active tasks read at the kill", FaultWorkerKill, []string{"r2", "r3"}, 1, 1},
		{"asynq's active tasks not read", FaultWorkerKill, nil, 2, 2},
		// A drain's tasks are timed from its SIGTERM, unbounded: the
		// worker renews its locks until it exits.
		{"asynq's active tasks read at a drain's exit", FaultWorkerKillDrain, []string{"r2", "r3"}, 1, 0},
	} {
		h := h
		k := kill
		k.Kind, k.Active = c.kind, c.active
		h.Faults = append(slices.Clone(h.Faults), k)
		r := Check(h)
		got := r.RecoveryMS[c.kind]
		if got == nil || got.Tasks != c.tasks || r.RecoveryOverBound != c.over || r.Violations() != c.over {
			t.Errorf("%s: recovery_ms %+v, recovery_over_bound %d (violations %d: %+v), want %d tasks timed and %d over", c.name, got, r.RecoveryOverBound, r.Violations(), r.Evidence, c.tasks, c.over)
		}
	}
}

// A Cluster master fails over at 40s (its replica promoted at 42.5s) while
// order 3's lock lives on it and order 4's elsewhere. On order 3, f1 held
// the lock at the failover and f2 took it after the promotion: an overlap
// of the two is put down to the failover only when the store accepted f1's
// commit before f2's begin, and f1 running on after f2's begin counts in
// lost_holders_not_cancelled. The report says what the failover cost: f1,
// a tenant's sync and order 4's f3 cut off, f1 and f3 resumed 3 s and 4 s
// after it; the master's locks served a job again 3 s after it (f1).
func TestCheckClusterFailover(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	failover := Fault{Kind: FaultClusterMasterKill, Target: "master a", Start: at(40000), Promoted: at(42500), End: at(44000),
		Resources: []string{"3", "tenant t1 permit 0"}}
	history := func(execs []Execution, writes []Write) History {
		h := clean()
		h.Redis = "cluster"
		h.Faults = append(h.Faults, failover)
		h.Executions = append(h.Executions, execs...)
		h.Writes = append(h.Writes, writes...)
		return h
	}
	x := func(order, task string, fence int64, from, to int, outcome string) Execution {
		return Execution{OrderID: order, TaskID: task, Fence: fence, Worker: "h:1", Started: at(from), Finished: at(to), Outcome: outcome}
	}
	w := func(order, task string, fence int64, op string, ms int) Write {
		return Write{OrderID: order, TaskID: task, Fence: fence, Op: op, At: at(ms)}
	}

	// f1 committed at 42.94s, just before f2 began at 43s: the overlap of
	// their records is the failover's, and j1 had ended.
	r := Check(history(
		[]Execution{x("3", "f1", 100, 39000, 42950, "ok"), x("3", "f2", 200, 42900, 43500, "ok")},
		[]Write{w("3", "f1", 100, "begin", 39001), w("3", "f1", 100, "commit", 42940), w("3", "f2", 200, "begin", 43000), w("3", "f2", 200, "commit", 43499)}))
	if r.Violations() != 0 || r.OverlapsFailover != 1 {
		t.Fatalf("commit before the next begin: %d violations (%+v), %d overlaps put down to the failover; want 0 and 1", r.Violations(), r.Evidence, r.OverlapsFailover)
	}

	// The store accepted f1's commit after f2's begin: the overlap is a
	// violation, and so is the stale commit.
	r = Check(history(
		[]Execution{x("3", "f1", 100, 39000, 42950, "ok"), x("3", "f2", 200, 42900, 43500, "ok")},
		[]Write{w("3", "f1", 100, "begin", 39001), w("3", "f2", 200, "begin", 42_920), w("3", "f1", 100, "commit", 42_940)}))
	if r.Overlaps != 1 || r.OverlapsFailover != 0 || r.StaleWritesAccepted != 1 {
		t.Fatalf("commit after the next begin: overlaps %d, put down to the failover %d, stale writes %d; want 1, 0, 1",
			r.Overlaps, r.OverlapsFailover, r.StaleWritesAccepted)
	}

	// The same overlap on order 4, whose lock was on another master: a
	// violation.
	r = Check(history(
		[]Execution{x("4", "f1", 100, 39000, 42950, "ok"), x("4", "f2", 200, 42900, 43500, "ok")},
		[]Write{w("4", "f1", 100, "begin", 39001), w("4", "f1", 100, "commit", 42940), w("4", "f2", 200, "begin", 43000)}))
	if r.Overlaps != 1 || r.OverlapsFailover != 0 {
		t.Fatalf("another master's order: overlaps %d, put down to the failover %d; want 1 and 0", r.Overlaps, r.OverlapsFailover)
	}

	// f1 went on after f2 began and was refused at its commit: no overlap
	// of ok runs, but a lost holder not cancelled in time.
	r = Check(history(
		[]Execution{x("3", "f1", 100, 39000, 43400, "fence_rejected"), x("3", "f2", 200, 42900, 43500, "ok")},
		[]Write{w("3", "f1", 100, "begin", 39001), w("3", "f2", 200, "begin", 43000), w("3", "f2", 200, "commit", 43499)}))
	if r.LostHoldersLate != 1 || r.Violations() != 1 || r.StaleWritesAccepted != 0 {
		t.Fatalf("a lost holder running on: lost_holders_not_cancelled %d, violations %d, stale writes %d; want 1, 1, 0 (%+v)",
			r.LostHoldersLate, r.Violations(), r.StaleWritesAccepted, r.Evidence)
	}

	// Both holders under way at the failover cancelled at their local
	// deadline (41.5s), before the promotion; their tasks ran again to ok.
	// A tenant's sync on the master, begun, never committed nor run again
	// (its run left no record: its store could not be reached).
	r = Check(history(
		[]Execution{
			x("3", "f1", 100, 39000, 41500, "lock_lost"), x("3", "f1", 200, 43000, 43200, "ok"),
			x("4", "f3", 50, 39500, 41600, "lock_lost"), x("4", "f3", 60, 44000, 44100, "ok"),
		},
		[]Write{w("3", "f1", 100, "begin", 39001), w("3", "f1", 200, "begin", 43000), w("3", "f1", 200, "commit", 43199),
			w("4", "f3", 50, "begin", 39501), w("4", "f4", 55, "begin", 42700), w("4", "f4", 55, "commit", 42800),
			w("4", "f3", 60, "begin", 44000), w("4", "f3", 60, "commit", 44099), w("tenant t1/0", "s1", 70, "begin", 39800)}))
	c := r.Failovers[FaultClusterMasterKill]
	if r.Violations() != 0 || c == nil || c.Count != 1 || c.Promoted != 1 || c.PromotedMS.Max != 2500 ||
		c.HoldersCancelled != 2 || c.HoldersCancelledElsewhere != 1 || c.ResumedMS != (Spread{P50: 4000, Max: 4000, Tasks: 2}) || c.NotResumed != 1 ||
		c.LocksBackMS != (Spread{P50: 3000, Max: 3000, Tasks: 1}) {
		t.Fatalf("cost of the failover: %+v (violations %d: %+v)", c, r.Violations(), r.Evidence)
	}
	if md := Markdown(r, history(nil, nil), "replay"); !strings.Contains(md, "| `cluster_master_kill` | 1 | 1 (2.5s / 2.5s) | 3s / 3s | 2 / 1 | 4s / 4s | 1 |") {
		t.Errorf("the report's failover table:\n%s", md)
	}
}
