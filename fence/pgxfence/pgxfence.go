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

// Queue queues the check of token for (resource, permit) in b, ahead of
// the writes it guards: sent with them in one round trip (tx.SendBatch),
// the fenced write costs no more round trips than the bare one. The check
// itself is Check's accepting statement; the returned Pending gives Check's
// verdict once the batch's results are read (BatchResults.Close). The
// queued writes run whatever the verdict: on an error, roll the
// transaction back, as after a refused Check.
//
//	b := &pgx.Batch{}
//	verdict := pgxfence.Queue(b, fences, job.Resource, job.Permit, job.Fence)
//	b.Queue("UPDATE orders SET paid = true WHERE id = $1", id)
//	if err := tx.SendBatch(ctx, b).Close(); err != nil {
//		return err
//	}
//	if err := verdict.Err(ctx, tx); err != nil {
//		return err // errors.Is(err, fence.ErrStale): roll back
//	}
func Queue(b *pgx.Batch, t *fence.Table, resource string, permit int, token int64) *Pending {
	p := &Pending{t: t, resource: resource, permit: permit, token: token}
	if p.err = postgresOnly(t); p.err != nil {
		return p
	}
	accept, read, err := bridge.Statements(t, resource, permit, token)
	if err != nil {
		p.err = err
		return p
	}
	p.read = read
	b.Queue(accept.SQL, accept.Args...).QueryRow(func(row pgx.Row) error {
		p.queued = true
		err := row.Scan(&p.current)
		switch {
		case err == nil:
			p.accepted = true
		case errors.Is(err, pgx.ErrNoRows): // refused: Err reads why
		default:
			p.scanErr = err
			return err
		}
		return nil
	})
	return p
}

// Pending is a check queued in a batch (Queue).
type Pending struct {
	t        *fence.Table
	resource string
	permit   int
	token    int64
	read     bridge.Stmt

	err      error // Queue's own: the check was not queued
	queued   bool  // its result was read
	accepted bool
	current  int64
	scanErr  error
}

// Err is Check's verdict on the queued check, once the batch's results have
// been read: nil when token was accepted; on a refusal it reads the fence
// row with q (the same transaction, which holds the row's lock) to say why,
// as Check does. A batch that failed before the check's result was read
// returns an error saying so.
func (p *Pending) Err(ctx context.Context, q Querier) error {
	switch {
	case p.err != nil:
		return p.err
	case p.scanErr != nil:
		return bridge.Verdict(p.t, p.resource, p.permit, p.token, 0, "", p.scanErr)
	case !p.queued:
		return bridge.Verdict(p.t, p.resource, p.permit, p.token, 0, "", errors.New("the batch's results were not read (close them first)"))
	case p.accepted:
		return bridge.Verdict(p.t, p.resource, p.permit, p.token, p.current, bridge.Lock(p.t), nil)
	}
	var current int64
	var lock string
	err := q.QueryRow(ctx, p.read.SQL, p.read.Args...).Scan(&current, &lock)
	return bridge.Verdict(p.t, p.resource, p.permit, p.token, current, lock, err)
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
