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
// N·(w+slack)/Per + Burst of them (G11 with slack 0), or "".
func overRate(us []int64, slack time.Duration) string {
	for i := range us {
		for j := i + ratedBurst; j < len(us); j++ {
			w := time.Duration(us[j]-us[i])*time.Microsecond + slack
			if count := j - i + 1; int64(count-ratedBurst)*int64(ratedPer) > int64(ratedN)*int64(w) {
				return fmt.Sprintf("%d within %v", count, w-slack)
			}
		}
	}
	return ""
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
