package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/lockstep-dev/lockstep/fence/internal/bridge"
)

// Querier is what Create and Check need of a database handle: *sql.Tx,
// *sql.Conn and *sql.DB all have it. Pass the transaction of the write that
// the fence guards.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Lease is what a lock holder has: *lockstep.Lease satisfies it. Key is the
// resource, Permit the permit of it, Fence the holder's fencing token.
type Lease interface {
	Key() string
	Permit() int
	Fence() int64
}

// Table is a fence table on one server dialect. Its methods are safe for
// concurrent use; LockName returns a modified copy.
type Table struct {
	d     dialect
	name  string // as given, for errors
	quote string // quoted for the dialect
	lock  string
	err   error // an invalid table name, returned by every method
	stmts statements
}

// statements are a table's SQL, built once per table and lock name.
type statements struct {
	ddl, accept, read string
	guard             string // MySQL: Exec's check, which fails on a refusal
}

// Postgres returns the fence table named table (optionally schema-qualified,
// "schema.table") on PostgreSQL. Names are identifiers ([A-Za-z_][A-Za-z0-9_]*)
// and are quoted, so their case is kept. An invalid name makes every method
// return an error.
func Postgres(table string) *Table { return newTable(postgres{}, table) }

// MySQL returns the fence table named table (optionally "database.table") on
// MySQL or MariaDB, with InnoDB. An invalid name makes every method return an
// error.
func MySQL(table string) *Table { return newTable(mysql{}, table) }

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func newTable(d dialect, table string) *Table {
	t := &Table{d: d, name: table}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		t.err = fmt.Errorf("fence: table name %q: at most one dot (schema.table)", table)
		return t
	}
	for i, p := range parts {
		if !identifier.MatchString(p) {
			t.err = fmt.Errorf("fence: table name %q: %q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", table, p)
			return t
		}
		parts[i] = d.quote(p)
	}
	t.quote = strings.Join(parts, ".")
	t.stmts = d.statements(t.quote)
	return t
}

// LockName returns a copy of t whose checks record name as the lock that
// issued the fences, and refuse a resource whose fence was recorded under
// another name (ErrOtherLock): fences of two locks (a Redis lock's and an
// etcd lock's, say) count separately and must never be compared. The default
// name is "".
func (t *Table) LockName(name string) *Table {
	c := *t
	c.lock = name
	return &c
}

// Name returns the table's name as given.
func (t *Table) Name() string { return t.name }

// DDL returns the CREATE TABLE IF NOT EXISTS statement that Create runs, for
// those who create tables with their own migration tool.
func (t *Table) DDL() string { return t.stmts.ddl }

// Create creates the table if it does not exist.
func (t *Table) Create(ctx context.Context, q Querier) error {
	return t.create(ctx, sqlRunner{q})
}

func (t *Table) create(ctx context.Context, r runner) error {
	if t.err != nil {
		return t.err
	}
	if err := r.Exec(ctx, t.stmts.ddl); err != nil {
		return fmt.Errorf("fence: create %s: %w", t.name, err)
	}
	return nil
}

// Check accepts token as the fence of (resource, permit) if it is at least
// the recorded one, and records it; the row stays locked until q's
// transaction ends, so the write that follows in that transaction is the
// holder's only if it commits. It returns a *StaleError (errors.Is(err,
// ErrStale)) when a higher fence was accepted, an error for which
// errors.Is(err, ErrOtherLock) holds when the resource's fence belongs to
// another lock name, one with ErrNoFence for a token of 0 or less, and the
// driver's error otherwise (IsRetryable tells a serialization failure).
//
// On a refusal the transaction is still usable but holds the fence row: roll
// it back.
func (t *Table) Check(ctx context.Context, q Querier, resource string, permit int, token int64) error {
	return t.check(ctx, sqlRunner{q}, resource, permit, token)
}

func (t *Table) check(ctx context.Context, r runner, resource string, permit int, token int64) error {
	if err := t.validate(resource, permit, token); err != nil {
		return err
	}
	current, lock, err := t.d.check(ctx, r, t.stmts, resource, permit, t.lock, token)
	if err != nil {
		return fmt.Errorf("fence: check %q permit %d in %s: %w", resource, permit, t.name, err)
	}
	return t.verdict(resource, permit, token, current, lock)
}

// verdict judges token by what the fence row of (resource, permit) holds
// after the accepting statement: its fence current and its lock name.
func (t *Table) verdict(resource string, permit int, token, current int64, lock string) error {
	switch {
	case lock != t.lock:
		return &OtherLockError{Resource: resource, Permit: permit, Lock: t.lock, Recorded: lock}
	case current > token:
		return &StaleError{Resource: resource, Permit: permit, Token: token, Current: current}
	case current < token:
		// The accepting statement ran under the row lock and left a lower
		// fence: the table is not what Create made (a trigger, a rule).
		return fmt.Errorf("fence: check %q permit %d in %s: fence %d not recorded (row holds %d)",
			resource, permit, t.name, token, current)
	}
	return nil
}

// CheckLease is Check with the resource, permit and fence of a lease, e.g. a
// *lockstep.Lease. A job handler passes job.Resource, job.Permit and
// job.Fence to Check.
func (t *Table) CheckLease(ctx context.Context, q Querier, l Lease) error {
	return t.Check(ctx, q, l.Key(), l.Permit(), l.Fence())
}

func (t *Table) validate(resource string, permit int, token int64) error {
	switch {
	case t.err != nil:
		return t.err
	case token <= 0:
		return &noFenceError{resource: resource, permit: permit, token: token}
	case resource == "":
		return errors.New("fence: empty resource")
	case permit < 0:
		return fmt.Errorf("fence: resource %q: negative permit %d", resource, permit)
	}
	return t.d.validate(resource, t.lock)
}

// runner runs a table's statements: on database/sql (sqlRunner) or, through
// package bridge, on another client (pgxfence).
type runner = bridge.Runner

type sqlRunner struct{ q Querier }

func (r sqlRunner) Exec(ctx context.Context, query string, args ...any) error {
	_, err := r.q.ExecContext(ctx, query, args...)
	return err
}

func (r sqlRunner) execID(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := r.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func (r sqlRunner) QueryRow(ctx context.Context, query string, args ...any) bridge.Row {
	return r.q.QueryRowContext(ctx, query, args...)
}

func init() {
	bridge.Create = func(ctx context.Context, t any, r bridge.Runner) error { return t.(*Table).create(ctx, r) }
	bridge.Check = func(ctx context.Context, t any, r bridge.Runner, resource string, permit int, token int64) error {
		return t.(*Table).check(ctx, r, resource, permit, token)
	}
	bridge.Postgres = func(t any) bool { _, ok := t.(*Table).d.(postgres); return ok }
	bridge.Statements = func(t any, resource string, permit int, token int64) (bridge.Stmt, bridge.Stmt, error) {
		tb := t.(*Table)
		if err := tb.validate(resource, permit, token); err != nil {
			return bridge.Stmt{}, bridge.Stmt{}, err
		}
		return bridge.Stmt{SQL: tb.stmts.accept, Args: []any{resource, permit, tb.lock, token}},
			bridge.Stmt{SQL: tb.stmts.read, Args: []any{resource, permit}}, nil
	}
	bridge.Verdict = func(t any, resource string, permit int, token, current int64, lock string, err error) error {
		tb := t.(*Table)
		if err != nil {
			return fmt.Errorf("fence: check %q permit %d in %s: %w", resource, permit, tb.name, err)
		}
		return tb.verdict(resource, permit, token, current, lock)
	}
	bridge.Lock = func(t any) string { return t.(*Table).lock }
}

// dialect is what differs between servers.
type dialect interface {
	quote(identifier string) string
	statements(table string) statements
	validate(resource, lock string) error
	// check records token for (resource, permit) under lock if it is at
	// least the recorded fence and lock is the recorded lock name, and
	// returns the fence and lock name the row holds afterwards, read under
	// the row's lock.
	check(ctx context.Context, r runner, s statements, resource string, permit int, lock string, token int64) (current int64, recordedLock string, err error)
	// exec runs query, the caller's write, and t's check of token in one
	// round trip (see Exec); token is valid.
	exec(ctx context.Context, t *Table, q Querier, resource string, permit int, token int64, query string, args []any) (sql.Result, error)
}
