package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// The ignorer's test:rated limit (testdata/ignorer): 5 a second, burst 1.
const (
	ratedN     = 5
	ratedPer   = time.Second
	ratedBurst = 1
)

// overRate returns a window of sorted times (µs) holding more than
// N·(w+slack)/Per + Burst of them (G11 with slack 0) under test:rated's
// limit, or "".
func overRate(us []int64, slack time.Duration) string {
	return overLimit(us, slack, ratedN, ratedPer, ratedBurst)
}

// overLimit is overRate under the limit n per per, burst.
func overLimit(us []int64, slack time.Duration, n int, per time.Duration, burst int) string {
	for i := range us {
		for j := i + burst; j < len(us); j++ {
			w := time.Duration(us[j]-us[i])*time.Microsecond + slack
			if count := j - i + 1; int64(count-burst)*int64(per) > int64(n)*int64(w) {
				return fmt.Sprintf("%d within %v", count, w-slack)
			}
		}
	}
	return ""
}

// admissionsLogged returns the rate admissions (server µs) that workers
// logged, by task id, failing the test for a task admitted twice.
func admissionsLogged(t *testing.T, workers []*proc) map[string]int64 {
	t.Helper()
	admitted := map[string]int64{}
	for _, w := range workers {
		for line := range strings.SplitSeq(w.allLogs(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "rate limit admitted" {
				continue
			}
			id := m["id"].(string)
			if _, twice := admitted[id]; twice {
				t.Errorf("task %s admitted twice", id)
			}
			admitted[id] = int64(m["admitted_us"].(float64))
		}
	}
	return admitted
}

// G11 with the built binaries: 30 tasks of one key on two worker processes,
// rate limited to 5 a second (burst 1). Every task completes once, none
// archived, each with asynq's Retried 0 (a delay is no attempt); the
// admissions the workers logged (the server's clock) hold over every window
// at most N·w/Per + Burst, and so do the runs' starts, read from the same
// clock, within the lag of a start behind its admission; and the 30 start
// within about 29 emission intervals (under-grant).
func TestRateLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	workers := []*proc{r.start(bins["ignorer"], nil), r.start(bins["ignorer"], nil)}
	for _, w := range workers {
		w.waitLog(20*time.Second, "worker started", func(m map[string]any) bool { return m["msg"] == "worker started" })
	}
	const n = 30
	for i := range n {
		r.enqueue("test:rated", fmt.Sprintf("rated-%d", i), `{"key":"k","work_ms":10}`)
	}
	for i := range n {
		info := r.waitTask("default", fmt.Sprintf("rated-%d", i), asynq.TaskStateCompleted, 60*time.Second)
		if info.Retried != 0 {
			t.Errorf("%s completed with Retried %d, want 0 (a rate delay is no attempt)", info.ID, info.Retried)
		}
	}
	if q, err := r.insp.GetQueueInfo("default"); err != nil || q.Archived != 0 {
		t.Fatalf("queue: %+v, err %v; want none archived", q, err)
	}

	// The admissions, from both workers' debug logs.
	admitted := admissionsLogged(t, workers)
	if len(admitted) != n {
		t.Fatalf("%d tasks admitted, want %d", len(admitted), n)
	}
	// The starts, as the handler recorded them.
	msgs, err := r.admin.XRange(context.Background(), "test:rated:runs", "-", "+").Result()
	if err != nil || len(msgs) != n {
		t.Fatalf("%d runs recorded (err %v), want %d: each task once", len(msgs), err, n)
	}
	var starts, admissions []int64
	var lag time.Duration
	for _, m := range msgs {
		id := m.Values["task_id"].(string)
		start, _ := strconv.ParseInt(m.Values["start_us"].(string), 10, 64)
		starts = append(starts, start)
		admissions = append(admissions, admitted[id])
		lag = max(lag, time.Duration(start-admitted[id])*time.Microsecond)
	}
	slices.Sort(starts)
	slices.Sort(admissions)
	if w := overRate(admissions, 0); w != "" {
		t.Fatalf("admissions: %s, over %d/%v + burst %d", w, ratedN, ratedPer, ratedBurst)
	}
	if w := overRate(starts, lag); w != "" {
		t.Fatalf("starts: %s, over %d/%v + burst %d (slack %v, the longest lag of a start)", w, ratedN, ratedPer, ratedBurst, lag)
	}
	span := time.Duration(starts[n-1]-starts[0]) * time.Microsecond
	ideal := time.Duration(n-ratedBurst) * ratedPer / ratedN
	if span > ideal+2*time.Second {
		t.Fatalf("%d starts took %v, want about %v: delayed tasks miss their turns", n, span, ideal)
	}
	minGap := time.Hour
	for i := 1; i < n; i++ {
		minGap = min(minGap, time.Duration(admissions[i]-admissions[i-1])*time.Microsecond)
	}
	t.Logf("%d tasks over %v (ideal %v), closest admissions %v apart (interval %v), longest start lag %v, 0 windows over the bound",
		n, span.Round(time.Millisecond), ideal, minGap, ratedPer/ratedN, lag)
}

// test:ratedlock's limit (testdata/ignorer): 5 a second, burst 3.
const (
	ratedLockN     = 5
	ratedLockPer   = time.Second
	ratedLockBurst = 3
)

// Issue 39, one admission for a rate and a lock, with the built binaries:
// 24 tasks of one key on two worker processes, each under the key's lock
// and rate (5 a second, burst 3), each working 150 ms, so that the lock
// binds while the burst lasts (the runs queue behind it) and the rate
// binds after. Each completes once with Retried 0, none archived; no two
// runs overlap; the admissions the workers logged hold to the bound
// exactly, and each run starts at once after its admission (its rate is
// asked when its lock is given, not before a wait for it), so the starts
// hold to the bound over w + that lag (0 over-grant); and the 24 start
// within about what the rate and the lock allow together, (24 − 3) × 200 ms
// (not under-granted by lock waits).
func TestRateAndLockOneAdmission(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	workers := []*proc{r.start(bins["ignorer"], nil), r.start(bins["ignorer"], nil)}
	for _, w := range workers {
		w.waitLog(20*time.Second, "worker started", func(m map[string]any) bool { return m["msg"] == "worker started" })
	}
	const n, workMS = 24, 150
	for i := range n {
		r.enqueue("test:ratedlock", fmt.Sprintf("rl-%d", i), fmt.Sprintf(`{"key":"k","work_ms":%d}`, workMS))
	}
	for i := range n {
		info := r.waitTask("default", fmt.Sprintf("rl-%d", i), asynq.TaskStateCompleted, 60*time.Second)
		if info.Retried != 0 {
			t.Errorf("%s completed with Retried %d, want 0 (a rate delay or a lock wait is no attempt)", info.ID, info.Retried)
		}
	}
	if q, err := r.insp.GetQueueInfo("default"); err != nil || q.Archived != 0 {
		t.Fatalf("queue: %+v, err %v; want none archived", q, err)
	}
	admitted := admissionsLogged(t, workers)
	if len(admitted) != n {
		t.Fatalf("%d tasks admitted, want %d", len(admitted), n)
	}
	msgs, err := r.admin.XRange(context.Background(), "test:ratedlock:runs", "-", "+").Result()
	if err != nil || len(msgs) != n {
		t.Fatalf("%d runs recorded (err %v), want %d: each task once", len(msgs), err, n)
	}
	type run struct{ start, end int64 }
	var runs []run
	var starts, admissions []int64
	var lag time.Duration
	for _, m := range msgs {
		id := m.Values["task_id"].(string)
		start, _ := strconv.ParseInt(m.Values["start_us"].(string), 10, 64)
		end, _ := strconv.ParseInt(m.Values["end_us"].(string), 10, 64)
		runs = append(runs, run{start, end})
		starts = append(starts, start)
		admissions = append(admissions, admitted[id])
		lag = max(lag, time.Duration(start-admitted[id])*time.Microsecond)
	}
	slices.SortFunc(runs, func(a, b run) int { return int(a.start - b.start) })
	for i := 1; i < n; i++ {
		if runs[i].start < runs[i-1].end {
			t.Fatalf("two runs under one lock overlap: %v and %v", runs[i-1], runs[i])
		}
	}
	slices.Sort(starts)
	slices.Sort(admissions)
	if w := overLimit(admissions, 0, ratedLockN, ratedLockPer, ratedLockBurst); w != "" {
		t.Fatalf("admissions: %s, over %d/%v + burst %d", w, ratedLockN, ratedLockPer, ratedLockBurst)
	}
	// A start follows its admission by the handler's start and its TIME
	// call, not by a wait for the lock (a run, 150 ms, or more).
	if maxLag := 100 * time.Millisecond; lag > maxLag {
		t.Fatalf("a run started %v after its admission, want at most %v: its rate turn was spent before its lock was free", lag, maxLag)
	}
	if w := overLimit(starts, lag, ratedLockN, ratedLockPer, ratedLockBurst); w != "" {
		t.Fatalf("starts: %s, over %d/%v + burst %d (slack %v, the longest lag of a start)", w, ratedLockN, ratedLockPer, ratedLockBurst, lag)
	}
	span := time.Duration(starts[n-1]-starts[0]) * time.Microsecond
	ideal := max(time.Duration(n-ratedLockBurst)*ratedLockPer/ratedLockN, time.Duration(n-1)*workMS*time.Millisecond)
	if span > ideal+time.Second {
		t.Fatalf("%d starts took %v, want about %v: the rate under-granted", n, span, ideal)
	}
	t.Logf("%d runs over %v (ideal %v, %.2f of it), the longest lag of a start behind its admission %v, 0 windows over the bound, no overlap",
		n, span.Round(time.Millisecond), ideal, float64(span)/float64(ideal), lag.Round(time.Microsecond))
}
