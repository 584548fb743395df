package orders

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/worker"
)

// PayOrder is the payload of "order:pay" tasks, e.g. {"order_id":"42","amount_cents":1999}.
type PayOrder struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// OrderLock is the resource a payment holds: one payment of an order at a
// time, on any number of workers.
func OrderLock(p PayOrder) string { return "order:" + p.OrderID }

// Fences is the table of fences in the service's own PostgreSQL.
var Fences = fence.Postgres("lockstep_fences")

// Pay returns the order:pay handler over db. It runs with the order's lock
// held, and its context ends if the lock is lost. The fence check and the
// payment commit in one transaction, so a holder whose lock passed on (paused
// past its TTL, say) is refused by the database itself. A retry finds the
// payment there: asynq delivers at least once.
func Pay(db *sql.DB) func(ctx context.Context, job worker.Job, p PayOrder) error {
	return func(ctx context.Context, job worker.Job, p PayOrder) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := Fences.Check(ctx, tx, job.Resource, job.Permit, job.Fence); err != nil {
			return fmt.Errorf("pay order %s: %w", p.OrderID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents, task_id, fence)
			VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING`,
			p.OrderID, p.AmountCents, job.ID, job.Fence); err != nil {
			return err
		}
		return tx.Commit()
	}
}
