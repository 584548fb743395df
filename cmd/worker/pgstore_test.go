package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// A holder paused (SIGSTOP) past its TTL, whose handler goes on to commit
// when it resumes (SIGCONT), is refused by PostgreSQL, and the next holder's
// write stands: the history read back from the demo store's rows shows the
// stale holder's begin, the next holder's begin and commit, and no commit of
// the stale fence. The stale holder is the ignorer's test:pay (the demo's
// PostgreSQL store, its context ignored: the worst a handler can do); the
// next holder is this binary's demo:order.pay with demo.store postgres.
func TestPausedHolderIsRefusedByPostgres(t *testing.T) {
	t.Parallel()
	pg := sqltest.Postgres(t)
	r := newRig(t, redistest.Start(t), testYAML)
	store := []string{"LOCKSTEP_DEMO_STORE=postgres", "LOCKSTEP_DEMO_POSTGRES_DSN=" + pg.DSN}
	// The careless holder serves a queue of its own: neither binary has the
	// other's task type.
	careless := r.start(bins["ignorer"], append(slices.Clip(store), "LOCKSTEP_WORKER_QUEUES=careless=1"))
	next := r.start(bins["worker"], store)
	// Running means started: the demo store's tables exist, which test:pay
	// does not create.
	next.waitLog(15*time.Second, "the demo worker to start", func(m map[string]any) bool { return m["msg"] == "lockstep worker running" })
	ctx := context.Background()
	writes := func() []demo.Write {
		t.Helper()
		orders, _, err := demo.ReadPostgresWrites(ctx, pg.DB)
		if err != nil {
			t.Fatal(err)
		}
		return orders
	}
	written := func(task, op string) func() bool {
		return func() bool {
			return slices.ContainsFunc(writes(), func(w demo.Write) bool { return w.TaskID == task && w.Op == op })
		}
	}

	const order = "paused"
	r.enqueue("test:pay", "stale", fmt.Sprintf(`{"order_id":%q,"work_ms":2000}`, order), asynq.Queue("careless"), asynq.MaxRetry(0))
	staleFence := careless.started("stale", 15*time.Second)
	waitFor(t, 10*time.Second, "the stale holder's begin row", written("stale", "begin"))
	careless.Pause()
	paused := time.Now()
	defer careless.Resume() // a failing test's cleanup kills it either way

	r.enqueueDemo("next", order, 50)
	waitFor(t, 20*time.Second, "the next holder's commit row", written("next", "commit"))
	if c := writes(); slices.ContainsFunc(c, func(w demo.Write) bool { return w.TaskID == "stale" && w.Op == "commit" }) {
		t.Fatalf("the stale holder committed before it was paused (its 2s of work passed): %+v", c)
	}
	t.Logf("the next holder committed %v after the stale holder's SIGSTOP (lock TTL %v)", time.Since(paused).Round(time.Millisecond), testTTL)
	careless.Resume()

	// The careless holder's task may run again meanwhile (a worker that
	// saw its lock expire while it was paused recovers it, G7): that run has
	// a fence above the next holder's, and its rows are its own.
	var verdict map[string]any
	waitFor(t, 15*time.Second, "the stale holder's commit verdict", func() bool {
		msgs, err := r.admin.XRange(ctx, "test:payer:runs", "-", "+").Result()
		for _, m := range msgs {
			if m.Values["fence"] == fmt.Sprint(staleFence) {
				verdict = m.Values
			}
		}
		return err == nil && verdict != nil
	})
	nextX := r.ended(next.started("next", time.Second), 10*time.Second)
	if nextX.Outcome != demo.OutcomeOK || nextX.Fence <= staleFence {
		t.Fatalf("the next holder's run %+v, want ok with a fence above the stale %d", nextX, staleFence)
	}
	var other int64
	_, _ = fmt.Sscan(fmt.Sprint(verdict["other"]), &other)
	if verdict["op"] != "commit" || verdict["ok"] != "0" || other < nextX.Fence || verdict["err"] != "" {
		t.Fatalf("the stale holder's commit (fence %d): %v, want refused by PostgreSQL with a fence at least the next holder's %d", staleFence, verdict, nextX.Fence)
	}

	// The log: the stale begin, the next holder's begin and commit, in that
	// order; no commit of the stale fence; nothing accepted below a fence
	// that had begun.
	var got []string
	for _, w := range writes() {
		if w.Fence <= nextX.Fence {
			got = append(got, fmt.Sprint(w.Op, " ", w.TaskID, " ", w.Fence))
		}
	}
	if want := []string{fmt.Sprint("begin stale ", staleFence), fmt.Sprint("begin next ", nextX.Fence), fmt.Sprint("commit next ", nextX.Fence)}; !slices.Equal(got, want) {
		t.Fatalf("the store's log up to the next holder's fence: %v, want %v", got, want)
	}
	for _, err := range demo.StaleWrites(writes()) {
		t.Error(err)
	}
	rec, found, err := demo.ReadPostgresRecord(ctx, pg.DB, demo.Resource(order), 0)
	if err != nil || !found || rec.Fence < nextX.Fence {
		t.Fatalf("the order's record %+v (found %t, %v), want the next holder's (fence %d) or a later one's", rec, found, err, nextX.Fence)
	}
	t.Logf("the stale holder's commit (fence %d) was refused with fence %d; the next holder's commit (fence %d) stands", staleFence, other, nextX.Fence)
}
