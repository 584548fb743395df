package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// stallAfter is the ignorer's StallAfter of test:stallpay and test:steady.
const stallAfter = 2 * time.Second

// A handler stuck in a call that ignores its context, declared
// StallAfter(2s): 2 s after its last progress its lock is handed to the
// task waiting for the same order (started within 2 s + 1 s of that
// progress, not before 2 s), while its process lives and would renew; the
// stuck handler's context is cancelled (lockstep_lock_lost_total{reason=
// "stalled"}), it is counted in lockstep_handlers_unreturned until it
// returns, and the commit it makes when it wakes is refused by PostgreSQL.
func TestStalledHolderIsHandedOnAndRefused(t *testing.T) {
	t.Parallel()
	pg := sqltest.Postgres(t)
	r := newRig(t, redistest.Start(t), testYAML)
	store := []string{"LOCKSTEP_DEMO_STORE=postgres", "LOCKSTEP_DEMO_POSTGRES_DSN=" + pg.DSN}
	stuck := r.start(bins["ignorer"], append(slices.Clip(store), "LOCKSTEP_WORKER_QUEUES=stuck=1"))
	next := r.start(bins["worker"], store)
	next.waitLog(15*time.Second, "the demo worker to start", proctest.Msg("lockstep worker running"))
	addr := stuck.httpAddr()
	ctx := context.Background()
	payer := func(fence int64, op string) map[string]any {
		msgs, err := r.admin.XRange(ctx, "test:payer:runs", "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Values["fence"] == fmt.Sprint(fence) && m.Values["op"] == op {
				return m.Values
			}
		}
		return nil
	}
	gauge := func(name string) string { return grepValue(scrape(t, addr, 5*time.Second), name) }

	const order = "stuck"
	r.enqueue("test:stallpay", "stuck", fmt.Sprintf(`{"order_id":%q,"work_ms":6000}`, order), asynq.Queue("stuck"), asynq.MaxRetry(0))
	stuckFence := stuck.started("stuck", 15*time.Second)
	var progress map[string]any
	waitFor(t, 10*time.Second, "the stuck handler's progress", func() bool { progress = payer(stuckFence, "progress"); return progress != nil })
	r.enqueueDemo("next", order, 50)

	nextX := r.ended(next.started("next", 10*time.Second), 10*time.Second)
	lastProgress, _ := strconv.ParseInt(progress["progress_ms"].(string), 10, 64)
	// Its progress comes after its begin on PostgreSQL, which beside a
	// CPU hog took over 2 s: a stall before it counts from the hold's start.
	logTime := func(rec map[string]any) int64 {
		at, err := time.Parse(time.RFC3339Nano, rec["time"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return at.UnixMilli()
	}
	stalled := logTime(stuck.waitLog(5*time.Second, "the stall logged", proctest.Msg("watchdog: lock lost; handler context cancelled", "reason", "stalled")))
	if lastProgress > stalled {
		lastProgress = logTime(stuck.waitLog(time.Second, "the stuck job's start", proctest.Msg("job started", "id", "stuck")))
		t.Logf("the stuck handler's progress came after its stall: counted from its start")
	}
	after := time.Duration(nextX.StartedMS-lastProgress) * time.Millisecond
	t.Logf("the next holder started %v after the stuck handler's last progress (StallAfter %v)", after, stallAfter)
	if after < stallAfter-50*time.Millisecond || after > stallAfter+time.Second {
		t.Errorf("the next holder started %v after the stuck handler's last progress, want from %v to %v", after, stallAfter, stallAfter+time.Second)
	}
	if nextX.Outcome != demo.OutcomeOK || nextX.Fence <= stuckFence {
		t.Fatalf("the next holder's run %+v, want ok with a fence above the stuck %d", nextX, stuckFence)
	}
	stuck.waitLog(5*time.Second, "the stall logged", proctest.Msg("watchdog: lock lost; handler context cancelled", "reason", "stalled"))
	if v := gauge("lockstep_handlers_unreturned"); v != "1" {
		t.Errorf("lockstep_handlers_unreturned = %q while the stuck handler runs on, want 1", v)
	}
	if v := gauge(`lockstep_lock_lost_total{reason="stalled"}`); v != "1" {
		t.Errorf(`lockstep_lock_lost_total{reason="stalled"} = %q, want 1`, v)
	}

	var verdict map[string]any
	waitFor(t, 15*time.Second, "the stuck handler's commit", func() bool { verdict = payer(stuckFence, "commit"); return verdict != nil })
	if verdict["ok"] != "0" || verdict["err"] != "" {
		t.Errorf("the stuck handler's commit (fence %d): %v, want refused by PostgreSQL", stuckFence, verdict)
	}
	waitFor(t, 5*time.Second, "lockstep_handlers_unreturned back to 0", func() bool { return gauge("lockstep_handlers_unreturned") == "0" })
}

// A handler that reports progress every 500 ms for 6 s under StallAfter(2s)
// is not stalled: it ends ok under its first fence. Meanwhile
// lockstep_lock_oldest_hold_seconds shows its hold's age; then 0.
func TestProgressKeepsAStallBoundHold(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	w := r.start(bins["ignorer"], nil)
	addr := w.httpAddr()
	oldest := func() float64 {
		v, _ := strconv.ParseFloat(grepValue(scrape(t, addr, 5*time.Second), "lockstep_lock_oldest_hold_seconds"), 64)
		return v
	}
	r.enqueue("test:steady", "steady", `{"key":"s","work_ms":6000}`, asynq.MaxRetry(0))
	fence := w.started("steady", 15*time.Second)
	waitFor(t, 5*time.Second, "the oldest hold's age past 1 s", func() bool { return oldest() >= 1 })
	var runs []map[string]any
	waitFor(t, 15*time.Second, "the steady run's end", func() bool {
		msgs, err := r.admin.XRange(context.Background(), "test:steady:runs", "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		runs = runs[:0]
		for _, m := range msgs {
			runs = append(runs, m.Values)
		}
		return len(runs) > 0
	})
	if len(runs) != 1 || runs[0]["outcome"] != "ok" || runs[0]["fence"] != fmt.Sprint(fence) {
		t.Fatalf("steady runs %v, want one ok under fence %d", runs, fence)
	}
	if rec := w.findLog(proctest.Msg("watchdog: lock lost; handler context cancelled")); rec != nil {
		t.Fatalf("a hold was lost: %v", rec)
	}
	waitFor(t, 5*time.Second, "the oldest hold's age back to 0", func() bool { return oldest() == 0 })
}

// grepValue returns the value of the series name (with its labels, if any)
// in a /metrics body, "" when absent.
func grepValue(body, name string) string {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}
