// Command ignorer is a worker for the tests. Its handler test:ignore works
// for work_ms ignoring its context (as a careless handler would), then
// records that it ran and returns nil. Its handler test:wait, with the Wait
// contention policy, works for work_ms (ending early if its context ends)
// and records each run's start and end with its fence. Its handler
// test:free takes no lock: it works for work_ms (ending early if its
// context ends) and records each run's start and end. Its handler test:pay,
// when LOCKSTEP_DEMO_POSTGRES_DSN is set, pays an order as demo:order.pay
// does on the demo's PostgreSQL store, under the same lock, but ignoring its
// context: it begins, works for work_ms and commits whatever happened
// meanwhile, as a handler paused between its last look at its context and
// its commit would; it records the commit's verdict. Its handler
// test:stallpay is test:pay declared StallAfter(2s), reporting progress once
// after its begin (recorded as progress_ms). Its handler test:steady,
// StallAfter(2s), reports progress every 500 ms for work_ms and records
// each run's end and fence. Its handler test:rated takes no lock and is
// rate limited per key (ratedLimit, key "rate:<key>"): it records each
// run's start (the Redis server's clock, the limit's, as start_us) and
// works for work_ms. Its handler test:ratedlock is test:rated under the
// lock lock:rated:<key> as well, limited by ratedLockLimit, and records each
// run's end too (end_us). Its handlers test:fair (FairBy, the tenant is key)
// and test:fairw (FairByWeighted, the tenant key of weight weight) take no
// lock: each records its run's tenant, start and end (Unix µs, this
// process's clock) and works for work_ms.
package main

import (
	"context"
	"database/sql"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/worker"
)

type payload struct {
	Key    string `json:"key"`
	WorkMS int    `json:"work_ms"`
	Weight int    `json:"weight"`
}

func main() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("LOCKSTEP_REDIS_ADDR")})
	record := func(ctx context.Context, stream string, values ...any) error {
		return rdb.XAdd(context.WithoutCancel(ctx), &redis.XAddArgs{Stream: stream, Values: values}).Err()
	}
	fair := func(stream string) func(context.Context, worker.Job, payload) error {
		return func(ctx context.Context, job worker.Job, p payload) error {
			start := time.Now()
			time.Sleep(time.Duration(p.WorkMS) * time.Millisecond)
			return record(ctx, stream, "task_id", job.ID, "tenant", p.Key, "start_us", start.UnixMicro(),
				"end_us", time.Now().UnixMicro(), "attempt", job.Attempt)
		}
	}
	handlers := []worker.Handler{
		worker.Handle("test:fair", fair("test:fair:runs")).FairBy(func(p payload) string { return p.Key }),
		worker.Handle("test:fairw", fair("test:fairw:runs")).FairByWeighted(func(p payload) (string, int) { return p.Key, p.Weight }),
		worker.Handle("test:ignore", func(ctx context.Context, job worker.Job, p payload) error {
			time.Sleep(time.Duration(p.WorkMS) * time.Millisecond) // ignores ctx
			return record(ctx, "test:ignorer:runs", "task_id", job.ID, "fence", job.Fence)
		}).Lock(func(p payload) string { return "lock:ignore:" + p.Key }, 0),
		worker.Handle("test:wait", func(ctx context.Context, job worker.Job, p payload) error {
			start := time.Now()
			if err := record(ctx, "test:waiter:runs", "task_id", job.ID, "fence", job.Fence, "event", "start",
				"at_ms", start.UnixMilli()); err != nil {
				return err
			}
			select {
			case <-time.After(time.Duration(p.WorkMS) * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			return record(ctx, "test:waiter:runs", "task_id", job.ID, "fence", job.Fence, "event", "end",
				"at_ms", time.Now().UnixMilli())
		}).Lock(func(p payload) string { return "lock:wait:" + p.Key }, 0).OnContention(worker.Wait(30 * time.Second)),
		worker.Handle("test:steady", func(ctx context.Context, job worker.Job, p payload) error {
			end := time.Now().Add(time.Duration(p.WorkMS) * time.Millisecond)
			for time.Now().Before(end) {
				lockstep.Progress(ctx)
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
					return record(ctx, "test:steady:runs", "task_id", job.ID, "fence", job.Fence, "outcome", context.Cause(ctx).Error())
				}
			}
			return record(ctx, "test:steady:runs", "task_id", job.ID, "fence", job.Fence, "outcome", "ok")
		}).Lock(func(p payload) string { return "lock:steady:" + p.Key }, 0).StallAfter(stallAfter),
		worker.Handle("test:rated", func(ctx context.Context, job worker.Job, p payload) error {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			if err := record(ctx, "test:rated:runs", "task_id", job.ID, "start_us", now.UnixMicro(), "attempt", job.Attempt); err != nil {
				return err
			}
			time.Sleep(time.Duration(p.WorkMS) * time.Millisecond)
			return nil
		}).Rate(func(p payload) string { return "rate:" + p.Key }, ratedLimit),
		worker.Handle("test:ratedlock", func(ctx context.Context, job worker.Job, p payload) error {
			start, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			time.Sleep(time.Duration(p.WorkMS) * time.Millisecond)
			end, err := rdb.Time(ctx).Result()
			if err != nil {
				return err
			}
			return record(ctx, "test:ratedlock:runs", "task_id", job.ID, "start_us", start.UnixMicro(), "end_us", end.UnixMicro(),
				"fence", job.Fence, "attempt", job.Attempt)
		}).Lock(func(p payload) string { return "lock:rated:" + p.Key }, 0).
			Rate(func(p payload) string { return "rate:" + p.Key }, ratedLockLimit),
		worker.Handle("test:free", func(ctx context.Context, job worker.Job, p payload) error {
			if err := record(ctx, "test:free:runs", "task_id", job.ID, "event", "start", "at_ms", time.Now().UnixMilli()); err != nil {
				return err
			}
			select {
			case <-time.After(time.Duration(p.WorkMS) * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			return record(ctx, "test:free:runs", "task_id", job.ID, "event", "end", "at_ms", time.Now().UnixMilli())
		}),
	}
	if dsn := os.Getenv("LOCKSTEP_DEMO_POSTGRES_DSN"); dsn != "" {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			panic(err)
		}
		// The demo's own store and lock name (lock.backend redis), so that
		// its rows and fences are those of demo:order.pay's runs.
		pg := demo.NewPostgres(db, "redis")
		pay := func(ctx context.Context, job worker.Job, p demo.Payload, stalls bool) error {
			hold := ctx
			ctx = context.WithoutCancel(ctx) // ignores ctx
			j := jobs.Job{ID: job.ID, Resource: job.Resource, Permit: job.Permit, Fence: job.Fence}
			if ok, other, err := pg.Begin(ctx, j, p.OrderID, procid.Self()); err != nil || !ok {
				return record(ctx, "test:payer:runs", "task_id", job.ID, "fence", job.Fence, "op", "begin", "ok", ok, "other", other, "err", errString(err))
			}
			if stalls {
				lockstep.Progress(hold)
				if err := record(ctx, "test:payer:runs", "task_id", job.ID, "fence", job.Fence, "op", "progress", "progress_ms", time.Now().UnixMilli()); err != nil {
					return err
				}
			}
			time.Sleep(time.Duration(p.WorkMS) * time.Millisecond)
			ok, other, err := pg.Commit(ctx, j, p.OrderID, procid.Self())
			return record(ctx, "test:payer:runs", "task_id", job.ID, "fence", job.Fence, "op", "commit", "ok", ok, "other", other, "err", errString(err))
		}
		lockOf := func(p demo.Payload) string { return demo.Resource(p.OrderID) }
		handlers = append(handlers,
			worker.Handle("test:pay", func(ctx context.Context, job worker.Job, p demo.Payload) error {
				return pay(ctx, job, p, false)
			}).Lock(lockOf, 0),
			worker.Handle("test:stallpay", func(ctx context.Context, job worker.Job, p demo.Payload) error {
				return pay(ctx, job, p, true)
			}).Lock(lockOf, 0).StallAfter(stallAfter))
	}
	worker.Main(handlers...)
}

// ratedLimit is test:rated's rate limit per key: one every 200 ms, one at
// once.
var ratedLimit = lockstep.RateLimit{N: 5, Per: time.Second, Burst: 1}

// ratedLockLimit is test:ratedlock's rate limit per key: one every 200 ms,
// three at once.
var ratedLockLimit = lockstep.RateLimit{N: 5, Per: time.Second, Burst: 3}

// stallAfter is the stall bound of test:stallpay and test:steady.
const stallAfter = 2 * time.Second

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
