package fence

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Exec runs query, one INSERT, UPDATE or DELETE of the caller's with its
// args as $1…$n, with the check of token for (resource, permit) in the same
// statement: a fenced write that costs the round trips of the bare one. The
// statement writes only if Check would accept token, and then records it
// and locks the fence row until q's transaction ends, as Check does; on a
// refusal the whole statement is undone and Exec returns Check's errors
// (*StaleError, ErrOtherLock, ErrNoFence), with the recorded fence and lock
// name. The sql.Result is the statement's own (RowsAffected counts its rows,
// not the fence row's).
//
// PostgreSQL only: the check is a data-modifying WITH in front of query, so
// query must not start with WITH of its own nor hold several statements
// (Exec refuses those, as it does every statement but INSERT, UPDATE and
// DELETE, and placeholders other than $1…$len(args)). PostgreSQL runs the
// statement's own write before the check, at the statement's end, so a
// refused statement has taken the locks of the rows it meant to write
// (until the rollback) and the fence row is locked after them. MySQL and
// MariaDB have no data-modifying WITH: there Exec returns an error for
// which errors.Is(err, errors.ErrUnsupported) holds; use Check.
//
// On any error the transaction is aborted (PostgreSQL refuses every
// statement after a failed one): roll it back. Given a *sql.DB, the
// statement is its own transaction: the write and the fence commit together.
func (t *Table) Exec(ctx context.Context, q Querier, resource string, permit int, token int64, query string, args ...any) (sql.Result, error) {
	if err := t.validate(resource, permit, token); err != nil {
		return nil, err
	}
	fenced, err := t.d.guard(t.quote, query, len(args))
	if err != nil {
		return nil, err
	}
	all := append(args[:len(args):len(args)], resource, permit, t.lock, token)
	res, err := q.ExecContext(ctx, fenced, all...)
	if err == nil {
		return res, nil
	}
	if current, lock, ok := refusal(err); ok {
		if v := t.verdict(resource, permit, token, current, lock); v != nil {
			return nil, v
		}
	}
	return nil, fmt.Errorf("fence: fenced statement on %q permit %d in %s: %w", resource, permit, t.name, err)
}

// ExecLease is Exec with the resource, permit and fence of a lease, e.g. a
// *lockstep.Lease.
func (t *Table) ExecLease(ctx context.Context, q Querier, l Lease, query string, args ...any) (sql.Result, error) {
	return t.Exec(ctx, q, l.Key(), l.Permit(), l.Fence(), query, args...)
}

// refusedMark starts what a refusing guard puts in its error: the recorded
// fence and the hex of the recorded lock name, then refusedEnd. The server
// quotes it in the message of the cast that fails on it, in any language.
const (
	refusedMark = "lockstep_fence refused: "
	refusedEnd  = " ."
)

// refusal reads the fence and lock name a refusing guard reported in err.
func refusal(err error) (current int64, lock string, ok bool) {
	msg := err.Error()
	i := strings.Index(msg, refusedMark)
	if i < 0 {
		return 0, "", false
	}
	rest := msg[i+len(refusedMark):]
	j := strings.Index(rest, refusedEnd)
	if j < 0 {
		return 0, "", false
	}
	num, hexLock, found := strings.Cut(rest[:j], " ")
	if !found {
		return 0, "", false
	}
	current, perr := strconv.ParseInt(num, 10, 64)
	b, herr := hex.DecodeString(hexLock)
	if perr != nil || herr != nil {
		return 0, "", false
	}
	return current, string(b), true
}
