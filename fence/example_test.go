package fence_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/worker"
)

// PayOrder is the payload of "order:pay" tasks.
type PayOrder struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// store is your database, opened with your driver, e.g. sql.Open("pgx", dsn).
var store *sql.DB

// fences is the fence table. LockName records which lock issued the fences,
// so that another lock's fences (etcd's, say) are refused, not compared.
var fences = fence.Postgres("lockstep_fences").LockName("redis")

// payOrder writes the payment and checks its fence in one transaction, so
// that both commit or neither does. A serialization failure or deadlock is
// retried a few times; a stale fence is not: a newer holder has begun.
func payOrder(ctx context.Context, job worker.Job, p PayOrder) error {
	// Begin: record the fence before the work (each statement on store
	// commits), so that an older holder is refused from now on, not only
	// once this one commits.
	if err := fences.Check(ctx, store, job.Resource, job.Permit, job.Fence); err != nil {
		return err
	}
	// ... the work ...
	for attempt := 1; ; attempt++ {
		err := pay(ctx, job, p)
		if !fence.IsRetryable(err) || attempt == 3 {
			return err
		}
	}
}

func pay(ctx context.Context, job worker.Job, p PayOrder) error {
	// ctx ends if the lock is lost: database/sql then rolls the transaction back.
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	// The fence first: it locks the fence row until the transaction ends.
	if err := fences.Check(ctx, tx, job.Resource, job.Permit, job.Fence); err != nil {
		return err // errors.Is(err, fence.ErrStale): refused, nothing written
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents, fence) VALUES ($1, $2, $3)`,
		p.OrderID, p.AmountCents, job.Fence)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// A worker whose handler writes through a fence: the table is created at
// start (or by your migrations, from Table.DDL).
func ExampleTable_Check() {
	if err := fences.Create(context.Background(), store); err != nil {
		log.Fatal(err)
	}
	worker.Main(
		worker.Handle("order:pay", payOrder).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second),
	)
}

// On MySQL or MariaDB (InnoDB) the same, with the MySQL table and `?`.
func ExampleMySQL() {
	fences := fence.MySQL("lockstep_fences").LockName("redis")
	pay := func(ctx context.Context, job worker.Job, p PayOrder) error {
		tx, err := store.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fences.Check(ctx, tx, job.Resource, job.Permit, job.Fence); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO payments (order_id, amount_cents, fence) VALUES (?, ?, ?)",
			p.OrderID, p.AmountCents, job.Fence)
		if err != nil {
			return err
		}
		return tx.Commit()
	}
	worker.Main(worker.Handle("order:pay", pay).
		Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second))
}

// On PostgreSQL the check can ride in the write's own statement: the fenced
// transaction takes the round trips of the bare one.
func ExampleTable_Exec() {
	pay := func(ctx context.Context, job worker.Job, p PayOrder) error {
		tx, err := store.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // after a refusal too: it aborted the transaction
		// One statement: the INSERT with the check in it; refused, the INSERT is undone.
		_, err = fences.Exec(ctx, tx, job.Resource, job.Permit, job.Fence,
			`INSERT INTO payments (order_id, amount_cents, fence) VALUES ($1, $2, $3)`,
			p.OrderID, p.AmountCents, job.Fence)
		if err != nil {
			return err // errors.Is(err, fence.ErrStale): refused, nothing written
		}
		// Later writes in tx need no check: the fence row is tx's until it ends.
		return tx.Commit()
	}
	worker.Main(worker.Handle("order:pay", pay).
		Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second))
}

// Code that is not a job checks with its lease.
func ExampleTable_CheckLease() {
	locker := lockstep.NewLocker(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))
	defer locker.Close(context.Background())
	err := locker.WithLock(context.Background(), "report:daily", func(ctx context.Context, lease *lockstep.Lease) error {
		tx, err := store.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fences.CheckLease(ctx, tx, lease); err != nil {
			return err
		}
		// ... the report's writes, in tx
		return tx.Commit()
	})
	if err != nil {
		log.Print(err)
	}
}
