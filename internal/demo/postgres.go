package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/jobs"
)

// The demo's tables in PostgreSQL (demo.store: postgres).
const (
	// FenceTable is the fence table of package fence: the highest fence
	// accepted per (resource, permit).
	FenceTable = "demo_fences"
	// RecordTable holds each order's (and tenant permit's) last committed
	// run: the record the Redis store keeps in lockstep:demo:order:<id>.
	RecordTable = "demo_records"
	// WritesTable is the accepted-writes log: one row per accepted begin and
	// commit, written in the transaction that accepted it. Its id orders
	// the writes of one (resource, permit) as the store accepted them: each
	// transaction takes the fence row's lock before it inserts.
	WritesTable = "demo_writes"
)

// Postgres is the demo's fenced store in PostgreSQL. A run's begin and its
// commit are each one transaction that checks the run's fence with package
// fence and writes in the same transaction (the begin its log row; the
// commit the record and its log row), so the write stands only if the fence
// does. A fence check refuses a fence below the highest accepted for the
// resource's permit: once the next holder has begun, a stale holder can
// neither begin nor commit (an equal fence is accepted, unlike the Redis
// store's begin: one run begins once anyway).
//
// The log is kept whole: the demo's database is the demo's, and the chaos
// checker reads it back entire (ReadPostgresWrites).
type Postgres struct {
	db     *sql.DB
	fences *fence.Table
}

// NewPostgres returns the store on db, whose fences are those of the lock
// named lockName (the worker names them after lock.backend; fences of two
// locks are never compared, see fence.Table.LockName). db's driver is the
// caller's; Create makes the tables.
func NewPostgres(db *sql.DB, lockName string) *Postgres {
	return &Postgres{db: db, fences: fence.Postgres(FenceTable).LockName(lockName)}
}

// Create creates the store's tables if they do not exist.
func (p *Postgres) Create(ctx context.Context) error {
	if err := p.fences.Create(ctx, p.db); err != nil {
		return err
	}
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS ` + RecordTable + ` (
	resource   text    NOT NULL,
	permit     integer NOT NULL,
	name       text    NOT NULL,
	fence      bigint  NOT NULL,
	task_id    text    NOT NULL,
	worker     text    NOT NULL,
	written_ms bigint  NOT NULL,
	writes     bigint  NOT NULL,
	PRIMARY KEY (resource, permit)
)`,
		`CREATE TABLE IF NOT EXISTS ` + WritesTable + ` (
	id       bigserial PRIMARY KEY,
	resource text    NOT NULL,
	permit   integer NOT NULL,
	name     text    NOT NULL,
	fence    bigint  NOT NULL,
	task_id  text    NOT NULL,
	worker   text    NOT NULL,
	op       text    NOT NULL,
	at_ms    bigint  NOT NULL
)`,
	} {
		if _, err := p.db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("demo: create tables: %w", err)
		}
	}
	return nil
}

// nowMS is the server's clock in Unix milliseconds, as the Redis store's
// at_ms is Redis's.
const nowMS = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

// Begin is run j's fenced begin on the record called name (an order, or
// TenantSlot's name of a tenant's permit), by worker: accepted (ok) unless a
// higher fence was accepted for j's resource and permit (other).
func (p *Postgres) Begin(ctx context.Context, j jobs.Job, name, worker string) (ok bool, other int64, err error) {
	return p.step(ctx, "begin", j, name, worker)
}

// Commit is run j's fenced final write of the record called name: accepted
// (ok) unless a higher fence was accepted since (other), a run that began
// after j.
func (p *Postgres) Commit(ctx context.Context, j jobs.Job, name, worker string) (ok bool, other int64, err error) {
	return p.step(ctx, "commit", j, name, worker)
}

// step runs op ("begin" or "commit") in one transaction.
func (p *Postgres) step(ctx context.Context, op string, j jobs.Job, name, worker string) (ok bool, other int64, err error) {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return false, 0, fmt.Errorf("demo %s: %w", op, err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	if err := p.fences.Check(ctx, tx, j.Resource, j.Permit, j.Fence); err != nil {
		if stale, ok := errors.AsType[*fence.StaleError](err); ok {
			return false, stale.Current, nil
		}
		return false, 0, fmt.Errorf("demo %s: %w", op, err)
	}
	if op == "commit" {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+RecordTable+` AS r
	(resource, permit, name, fence, task_id, worker, written_ms, writes)
VALUES ($1, $2, $3, $4, $5, $6, `+nowMS+`, 1)
ON CONFLICT (resource, permit) DO UPDATE SET fence = EXCLUDED.fence, task_id = EXCLUDED.task_id,
	worker = EXCLUDED.worker, written_ms = EXCLUDED.written_ms, writes = r.writes + 1`,
			j.Resource, j.Permit, name, j.Fence, j.ID, worker); err != nil {
			return false, 0, fmt.Errorf("demo %s: %w", op, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+WritesTable+`
	(resource, permit, name, fence, task_id, worker, op, at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, `+nowMS+`)`,
		j.Resource, j.Permit, name, j.Fence, j.ID, worker, op); err != nil {
		return false, 0, fmt.Errorf("demo %s: %w", op, err)
	}
	if err := tx.Commit(); err != nil {
		return false, 0, fmt.Errorf("demo %s: %w", op, err)
	}
	return true, j.Fence, nil
}

// Record is an order's (or a tenant permit's) last committed run in
// RecordTable.
type Record struct {
	Fence  int64
	TaskID string
	Worker string
	Writes int64 // commits accepted in all
}

// ReadPostgresRecord returns the record of resource's permit, and false when
// no run committed there.
func ReadPostgresRecord(ctx context.Context, db *sql.DB, resource string, permit int) (Record, bool, error) {
	var r Record
	err := db.QueryRowContext(ctx, `SELECT fence, task_id, worker, writes FROM `+RecordTable+`
WHERE resource = $1 AND permit = $2`, resource, permit).Scan(&r.Fence, &r.TaskID, &r.Worker, &r.Writes)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("demo: read %s: %w", RecordTable, err)
	}
	return r, true, nil
}

// ReadPostgresWrites returns the accepted-writes log in the store's order:
// the orders' writes (OrderID the order) and the tenants' (OrderID
// TenantSlot's "<tenant>/<permit>"), as ReadWrites and ReadTenantWrites
// return the Redis store's logs.
func ReadPostgresWrites(ctx context.Context, db *sql.DB) (orders, tenants []Write, err error) {
	rows, err := db.QueryContext(ctx, `SELECT id, resource, name, fence, task_id, worker, op, at_ms FROM `+WritesTable+` ORDER BY id`)
	if err != nil {
		return nil, nil, fmt.Errorf("demo: read %s: %w", WritesTable, err)
	}
	defer rows.Close()
	for rows.Next() {
		var w Write
		var id int64
		var resource string
		if err := rows.Scan(&id, &resource, &w.OrderID, &w.Fence, &w.TaskID, &w.Worker, &w.Op, &w.AtMS); err != nil {
			return nil, nil, fmt.Errorf("demo: read %s: %w", WritesTable, err)
		}
		w.ID = fmt.Sprint(id)
		if strings.HasPrefix(resource, TenantResource("")) {
			tenants = append(tenants, w)
		} else {
			orders = append(orders, w)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("demo: read %s: %w", WritesTable, err)
	}
	return orders, tenants, nil
}
