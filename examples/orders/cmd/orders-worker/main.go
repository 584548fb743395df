// Command orders-worker is the service's worker: its own handlers, with the
// flags, configuration (LOCKSTEP_* variables), endpoints and shutdown of
// Lockstep's worker. Its database is its own setting: ORDERS_DATABASE_URL.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/lockstep-dev/lockstep/worker"

	"example.com/orders"
)

func main() {
	db, err := sql.Open("pgx", os.Getenv("ORDERS_DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders-worker:", err)
		os.Exit(2)
	}
	defer db.Close()
	setup := worker.OnStart(func(ctx context.Context, rt worker.Runtime) error {
		rt.Log.Info("orders: creating the tables if missing")
		return orders.Schema(ctx, db)
	})
	worker.Main(append([]worker.Handler{setup}, orders.Handlers(db)...)...)
}
