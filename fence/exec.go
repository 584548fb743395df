package fence

import (
	"context"
	"database/sql"
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
