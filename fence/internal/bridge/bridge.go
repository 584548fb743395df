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
)
