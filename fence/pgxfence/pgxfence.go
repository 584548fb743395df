// Package pgxfence checks fences with pgx's own interface (pgx.Tx,
// *pgx.Conn, *pgxpool.Pool) instead of database/sql: the same table and the
// same guarantees as package fence's Check, in the caller's pgx transaction.
// It is apart from package fence so that only its importers compile pgx.
//
//	fences := fence.Postgres("lockstep_fences")
//	tx, err := pool.Begin(ctx)
//	...
//	if err := pgxfence.Check(ctx, tx, fences, job.Resource, job.Permit, job.Fence); err != nil {
//		return err // errors.Is(err, fence.ErrStale), fence.IsRetryable(err) as with database/sql
//	}
package pgxfence

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/fence/internal/bridge"
)

// Querier is what pgx.Tx, *pgx.Conn and *pgxpool.Pool have. Pass the
// transaction of the write that the fence guards.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Create is fence's (*Table).Create on a pgx client. t must be a
// fence.Postgres table.
func Create(ctx context.Context, q Querier, t *fence.Table) error {
	if err := postgresOnly(t); err != nil {
		return err
	}
	return bridge.Create(ctx, t, runner{q})
}

// Check is fence's (*Table).Check on a pgx client: the same verdicts and
// errors. t must be a fence.Postgres table.
func Check(ctx context.Context, q Querier, t *fence.Table, resource string, permit int, token int64) error {
	if err := postgresOnly(t); err != nil {
		return err
	}
	return bridge.Check(ctx, t, runner{q}, resource, permit, token)
}

// CheckLease is Check with a lease's key, permit and fence.
func CheckLease(ctx context.Context, q Querier, t *fence.Table, l fence.Lease) error {
	return Check(ctx, q, t, l.Key(), l.Permit(), l.Fence())
}

func postgresOnly(t *fence.Table) error {
	if t == nil || !bridge.Postgres(t) {
		return errors.New("pgxfence: the table is not a fence.Postgres table")
	}
	return nil
}

type runner struct{ q Querier }

func (r runner) Exec(ctx context.Context, query string, args ...any) error {
	_, err := r.q.Exec(ctx, query, args...)
	return err
}

func (r runner) QueryRow(ctx context.Context, query string, args ...any) bridge.Row {
	return r.q.QueryRow(ctx, query, args...)
}
