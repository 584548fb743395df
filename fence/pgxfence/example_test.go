package pgxfence_test

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/fence/pgxfence"
	"github.com/lockstep-dev/lockstep/worker"
)

// pool is your PostgreSQL pool, from pgxpool.New(ctx, dsn).
var pool *pgxpool.Pool

var fences = fence.Postgres("lockstep_fences")

// A handler that sends its fence check and its write in one batch: the
// fenced transaction takes the round trips of the bare one.
func payOrderBatched(ctx context.Context, job worker.Job, p PayOrder) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // after Commit, a no-op

	b := &pgx.Batch{}
	verdict := pgxfence.Queue(b, fences, job.Resource, job.Permit, job.Fence)
	b.Queue("UPDATE orders SET paid = true, fence = $2 WHERE id = $1", p.OrderID, job.Fence)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if err := verdict.Err(ctx, tx); err != nil {
		return err // errors.Is(err, fence.ErrStale): a newer holder wrote; the deferred rollback undoes the update
	}
	return tx.Commit(ctx)
}

// PayOrder is the payload of "order:pay" tasks.
type PayOrder struct {
	OrderID string `json:"order_id"`
}

func ExampleQueue() {
	worker.Main(
		worker.Handle("order:pay", payOrderBatched).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second),
	)
}
