package demo

import (
	"context"
	"fmt"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// The PostgreSQL store is fenced at both ends, per (resource, permit): once
// the next holder has begun, the stale holder's commit and begin are
// refused with the fence that stood in the way, and the log read back holds
// exactly the accepted steps, in the store's order.
func TestPostgresBeginAndCommitAreFenced(t *testing.T) {
	t.Parallel()
	db, pg := newPostgres(t)
	ctx := context.Background()
	if err := pg.Create(ctx); err != nil { // again: the tables exist
		t.Fatal(err)
	}
	const f1, f2 = 1_700_000_000_000_010, 1_700_000_000_000_020
	run := func(fence int64, task string) jobs.Job {
		return jobs.Job{ID: task, Resource: Resource("1"), Fence: fence}
	}
	for i, c := range []struct {
		op        string
		j         jobs.Job
		ok        bool
		wantOther int64
	}{
		{"begin", run(f1, "a"), true, f1},
		{"begin", run(f2, "b"), true, f2},   // the next holder begins
		{"commit", run(f1, "a"), false, f2}, // the stale holder's commit is refused already
		{"commit", run(f2, "b"), true, f2},
		{"begin", run(f1, "c"), false, f2}, // and so is a stale begin
	} {
		step := pg.Begin
		if c.op == "commit" {
			step = pg.Commit
		}
		ok, other, err := step(ctx, c.j, "1", "w")
		if err != nil || ok != c.ok || other != c.wantOther {
			t.Errorf("step %d (%s fence %d): ok %t, other %d, err %v; want ok %t, other %d",
				i, c.op, c.j.Fence, ok, other, err, c.ok, c.wantOther)
		}
	}
	// A tenant's permits are fenced apart: permit 1 takes a fence below
	// permit 0's.
	tenant := func(permit int, fence int64) jobs.Job {
		return jobs.Job{ID: fmt.Sprint("t", permit), Resource: TenantResource("7"), Permit: permit, Fence: fence}
	}
	for _, j := range []jobs.Job{tenant(0, f2), tenant(1, f1)} {
		if ok, other, err := pg.Begin(ctx, j, TenantSlot("7", j.Permit), "w"); !ok || err != nil {
			t.Errorf("tenant permit %d begin fence %d: refused (other %d, %v)", j.Permit, j.Fence, other, err)
		}
		if ok, other, err := pg.Commit(ctx, j, TenantSlot("7", j.Permit), "w"); !ok || err != nil {
			t.Errorf("tenant permit %d commit fence %d: refused (other %d, %v)", j.Permit, j.Fence, other, err)
		}
	}

	orders, tenants, err := ReadPostgresWrites(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	checkLog(t, orders, fmt.Sprint("begin ", f1, " a"), fmt.Sprint("begin ", f2, " b"), fmt.Sprint("commit ", f2, " b"))
	if len(tenants) != 4 || tenants[0].OrderID != "7/0" || tenants[3].OrderID != "7/1" {
		t.Fatalf("tenant log %+v, want a begin and a commit on 7/0, then on 7/1", tenants)
	}
	if errs := StaleWrites(append(orders, tenants...)); len(errs) != 0 {
		t.Fatalf("stale writes in a clean log: %v", errs)
	}
	rec, found, err := ReadPostgresRecord(ctx, db.DB, Resource("1"), 0)
	if err != nil || !found || rec.Fence != f2 || rec.TaskID != "b" || rec.Writes != 1 {
		t.Fatalf("record %+v (found %t, %v), want fence %d by b, 1 write", rec, found, err, f2)
	}
}

// The demo job on the PostgreSQL store: a run commits its fence; a run
// whose resource has a higher fence recorded ends fence_rejected, and its
// steps leave no row.
func TestPostgresDemoJob(t *testing.T) {
	t.Parallel()
	db, pg := newPostgres(t)
	ctx := context.Background()
	if err := fence.Postgres(FenceTable).LockName("redis").Check(ctx, db.DB, Resource("stale"), 0, 1<<62); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, WithPostgres(pg))
	e.enqueue(t, "ok", `{"order_id":"ok","work_ms":0}`)
	e.enqueue(t, "stale", `{"order_id":"stale","work_ms":0}`, asynq.MaxRetry(0))
	e.waitState(t, "ok", asynq.TaskStateCompleted)
	e.waitState(t, "stale", asynq.TaskStateArchived)

	execs, err := ReadExecutions(ctx, e.admin, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Execution{}
	for _, x := range execs {
		got[x.OrderID] = x
	}
	if got["ok"].Outcome != OutcomeOK || got["stale"].Outcome != OutcomeFenceRejected {
		t.Fatalf("executions %+v, want ok ok and stale fence_rejected", got)
	}
	rec, found, err := ReadPostgresRecord(ctx, db.DB, Resource("ok"), 0)
	if err != nil || !found || rec.Fence != got["ok"].Fence || rec.TaskID != "ok" || rec.Worker != "test-worker" {
		t.Fatalf("record of ok: %+v (found %t, %v), want the ok run's fence %d", rec, found, err, got["ok"].Fence)
	}
	orders, _, err := ReadPostgresWrites(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(orders) != 2 || orders[0].OrderID != "ok" || orders[1].Op != "commit" {
		t.Fatalf("log %+v, want the ok run's begin and commit alone", orders)
	}
}

// newPostgres is a private PostgreSQL with the demo's tables, the store's
// fences named after the redis back end.
func newPostgres(t *testing.T) (*sqltest.DB, *Postgres) {
	t.Helper()
	db := sqltest.Postgres(t)
	pg := NewPostgres(db.DB, "redis")
	if err := pg.Create(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, pg
}
