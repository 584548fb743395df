// Package orders is a team's own service that runs its jobs with Lockstep:
// an order is paid by a handler under the order's lock (pay.go), and the
// payment row is written together with a fence check in the team's own
// PostgreSQL, so a holder whose lock passed on cannot write. Copy it as the
// start of yours.
package orders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/worker"
)

// TaskPay is the task type of a payment.
const TaskPay = "order:pay"

// Validate refuses a payload that can never succeed: the worker archives
// the task at once with this error, instead of retrying it.
func (p PayOrder) Validate() error {
	if p.OrderID == "" || p.AmountCents <= 0 {
		return errors.New("order_id and a positive amount_cents are required")
	}
	return nil
}

// Schema creates the service's tables if missing: its payments, and the
// fences (Fences.DDL() is the statement, for a migration tool of yours).
func Schema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payments (
		order_id     text PRIMARY KEY,
		amount_cents bigint NOT NULL,
		task_id      text NOT NULL,
		fence        bigint NOT NULL,
		paid_at      timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return err
	}
	return Fences.Create(ctx, db)
}

// Handlers are the service's handlers, for worker.Main.
func Handlers(db *sql.DB) []worker.Handler {
	return []worker.Handler{
		worker.Handle(TaskPay, Pay(db)).Lock(OrderLock, 30*time.Second),
	}
}

// Enqueue asks for the payment of p, as application code does: with
// asynq's client (any client of asynq v0.26), on the queue the workers
// serve. The task id makes a second request for the same order fail with
// asynq.ErrTaskIDConflict while the first is kept; MaxRetry bounds the
// failed runs (asynq's default is 25). A task that waits for its busy lock
// spends none of them.
func Enqueue(ctx context.Context, client *asynq.Client, p PayOrder) (*asynq.TaskInfo, error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return client.EnqueueContext(ctx, asynq.NewTask(TaskPay, payload),
		asynq.Queue("default"), asynq.MaxRetry(5), asynq.TaskID("pay:"+p.OrderID))
}
