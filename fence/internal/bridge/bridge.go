// Package bridge lets fence's client adapters (pgxfence) run a Table's
// statements on their own client, without package fence exporting its
// machinery or importing any client. Package fence fills the functions in
// its init.
package bridge

import "context"

// Row is one row of a query: *sql.Row and pgx.Row have Scan.
type Row interface{ Scan(dest ...any) error }

// Runner runs a Table's statements on a client.
type Runner interface {
	Exec(ctx context.Context, query string, args ...any) error
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Set by package fence; table is a *fence.Table.
var (
	Create func(ctx context.Context, table any, r Runner) error
	Check  func(ctx context.Context, table any, r Runner, resource string, permit int, token int64) error
	// Postgres reports whether table is a PostgreSQL table.
	Postgres func(table any) bool
	// Statements validates a check of token and returns its accepting
	// statement (a row back: accepted, with the fence it holds) and the
	// read of the row that a refusal needs (its fence and lock name).
	Statements func(table any, resource string, permit int, token int64) (accept, read Stmt, err error)
	// Verdict is Check's result from what the row holds after the
	// accepting statement (current, lock), or from err.
	Verdict func(table any, resource string, permit int, token, current int64, lock string, err error) error
	// Lock is the table's lock name.
	Lock func(table any) string
)

// Stmt is a statement and its arguments.
type Stmt struct {
	SQL  string
	Args []any
}
