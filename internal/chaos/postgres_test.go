package chaos

import (
	"context"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// With the store in PostgreSQL, stale_writes_accepted is counted from the
// log table's rows: a commit row whose fence is below one that began before
// it (as a store without the fence check would accept) is one violation,
// and the tenants' rows are checked per permit.
func TestCheckCountsStaleWritesFromPostgresRows(t *testing.T) {
	t.Parallel()
	db := sqltest.Postgres(t)
	ctx := context.Background()
	pg := demo.NewPostgres(db.DB, "redis")
	if err := pg.Create(ctx); err != nil {
		t.Fatal(err)
	}
	job := func(resource string, permit int, fence int64, id string) jobs.Job {
		return jobs.Job{ID: id, Resource: resource, Permit: permit, Fence: fence}
	}
	for _, s := range []struct {
		step func(context.Context, jobs.Job, string, string) (bool, int64, error)
		j    jobs.Job
		name string
	}{
		{pg.Begin, job(demo.Resource("1"), 0, 10, "a"), "1"},
		{pg.Begin, job(demo.Resource("1"), 0, 20, "b"), "1"},
		{pg.Commit, job(demo.Resource("1"), 0, 20, "b"), "1"},
		{pg.Begin, job(demo.TenantResource("t1"), 1, 5, "c"), demo.TenantSlot("t1", 1)},
		{pg.Begin, job(demo.TenantResource("t1"), 2, 3, "d"), demo.TenantSlot("t1", 2)}, // another permit: not stale
	} {
		if ok, other, err := s.step(ctx, s.j, s.name, "w"); !ok || err != nil {
			t.Fatalf("%s fence %d: refused (%d, %v)", s.j.ID, s.j.Fence, other, err)
		}
	}
	writes, err := postgresWrites(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	h := clean()
	h.Writes = writes
	if r := Check(h); r.StaleWritesAccepted != 0 || r.WritesChecked != 5 {
		t.Fatalf("the store's own rows: %d stale of %d checked, want 0 of 5", r.StaleWritesAccepted, r.WritesChecked)
	}
	// The row a store without the fence check would have written: the stale
	// holder's commit, after the next one began.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+demo.WritesTable+` (resource, permit, name, fence, task_id, worker, op, at_ms)
VALUES ($1, 0, '1', 10, 'a', 'w', 'commit', 1)`, demo.Resource("1")); err != nil {
		t.Fatal(err)
	}
	if h.Writes, err = postgresWrites(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	if r := Check(h); r.StaleWritesAccepted != 1 {
		t.Fatalf("a stale commit row: stale_writes_accepted %d, want 1", r.StaleWritesAccepted)
	}
}
