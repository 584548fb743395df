package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Exec runs query, the caller's write with its args, with the check of
// token for (resource, permit) in the same round trip: a fenced write that
// costs the round trips of the bare one. The write is made only if Check
// would accept token, which is then recorded and the fence row locked until
// q's transaction ends, as Check does; on a refusal the write is undone (or
// never made) and Exec returns Check's errors (*StaleError, ErrOtherLock,
// ErrNoFence) with the recorded fence and lock name. The sql.Result is the
// write's own (RowsAffected counts its rows, not the fence row's).
//
// On PostgreSQL, query is one INSERT, UPDATE or DELETE with its args as
// $1…$n, and the check a data-modifying WITH in front of it, in the same
// statement: Exec refuses a statement that starts with WITH of its own,
// several statements, any other statement and placeholders beyond
// $len(args). PostgreSQL runs the statement's own write first and the
// check at the statement's end, so a refused statement has taken the locks
// of the rows it meant to write (until the rollback) and the fence row is
// locked after them. Any error aborts the transaction (PostgreSQL refuses
// every statement after a failed one): roll it back. Given a *sql.DB, the
// statement is a transaction of its own: the write and the fence commit
// together.
//
// MySQL and MariaDB have no data-modifying WITH: the check and query go as
// one multi-statement query, the check first, which stops the query when it
// refuses. q must be a *sql.Tx (outside a transaction each statement would
// commit apart) of a pool whose DSN has multiStatements=true and
// interpolateParams=true. A refusal leaves the transaction usable, holding
// the fence row, as Check's does: roll it back.
func (t *Table) Exec(ctx context.Context, q Querier, resource string, permit int, token int64, query string, args ...any) (sql.Result, error) {
	if err := t.validate(resource, permit, token); err != nil {
		return nil, err
	}
	return t.d.exec(ctx, t, q, resource, permit, token, query, args)
}

// failed is Exec's error for err, the fenced statement's.
func (t *Table) failed(resource string, permit int, err error) error {
	return fmt.Errorf("fence: fenced statement on %q permit %d in %s: %w", resource, permit, t.name, err)
}

// ExecLease is Exec with the resource, permit and fence of a lease, e.g. a
// *lockstep.Lease.
func (t *Table) ExecLease(ctx context.Context, q Querier, l Lease, query string, args ...any) (sql.Result, error) {
	return t.Exec(ctx, q, l.Key(), l.Permit(), l.Fence(), query, args...)
}

// QueryRow is Exec for a PostgreSQL write that returns a row, an INSERT,
// UPDATE or DELETE with RETURNING (the id an INSERT gave its row, say): the
// row is read with the returned Row's Scan, which returns Exec's errors.
// PostgreSQL runs such a statement, its check included, to its end before
// it sends a row, so a refusal is Scan's error and nothing is scanned. A
// statement that returns no row (an UPDATE that matched none) gives
// sql.ErrNoRows (the fence recorded, as Exec does for a write of no row);
// a statement without RETURNING is refused before it runs: use Exec.
//
// On MySQL and MariaDB, which have no RETURNING to read in the same query,
// Scan returns an error: use Exec (its sql.Result has LastInsertId), or
// Check and the statement.
func (t *Table) QueryRow(ctx context.Context, q Querier, resource string, permit int, token int64, query string, args ...any) *Row {
	r := &Row{t: t, resource: resource, permit: permit, token: token}
	if r.err = t.validate(resource, permit, token); r.err != nil {
		return r
	}
	pg, ok := t.d.(postgres)
	if !ok {
		r.err = errors.New("fence: QueryRow is PostgreSQL's: on MySQL and MariaDB use Exec (its sql.Result has LastInsertId), or Check and the statement in one transaction")
		return r
	}
	fenced, all, returns, err := pg.fenced(t, resource, permit, token, query, args)
	if err == nil && !returns {
		err = errors.New("fence: QueryRow takes a statement with RETURNING, and this one returns no row: use Exec")
	}
	if err != nil {
		r.err = err
		return r
	}
	r.row = q.QueryRowContext(ctx, fenced, all...)
	return r
}

// QueryRowLease is QueryRow with the resource, permit and fence of a lease,
// e.g. a *lockstep.Lease.
func (t *Table) QueryRowLease(ctx context.Context, q Querier, l Lease, query string, args ...any) *Row {
	return t.QueryRow(ctx, q, l.Key(), l.Permit(), l.Fence(), query, args...)
}

// Row is the row a fenced write returned (QueryRow).
type Row struct {
	t        *Table
	resource string
	permit   int
	token    int64
	row      *sql.Row
	err      error // QueryRow's own, before the statement was sent
}

// Scan copies the row's columns into dest, as (*sql.Row).Scan does. It
// returns Check's errors for a refusal (*StaleError, ErrOtherLock,
// ErrNoFence), the write undone; sql.ErrNoRows for an accepted statement
// that returned no row; other errors wrapped.
func (r *Row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	err := r.row.Scan(dest...)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return postgres{}.execErr(r.t, r.resource, r.permit, r.token, err)
}
