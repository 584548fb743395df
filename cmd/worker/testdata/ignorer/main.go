// Command ignorer is a worker for the tests. Its handler test:ignore works
// for work_ms ignoring its context (as a careless handler would), then
// records that it ran and returns nil. Its handler test:wait, with the Wait
// contention policy, works for work_ms (ending early if its context ends)
// and records each run's start and end with its fence. Its handler
// test:free takes no lock: it works for work_ms (ending early if its
// context ends) and records each run's start and end.
package main

import (
	"context"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/worker"
)

type payload struct {
	Key    string `json:"key"`
	WorkMS int    `json:"work_ms"`
}

func main() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("LOCKSTEP_REDIS_ADDR")})
	record := func(ctx context.Context, stream string, values ...any) error {
		return rdb.XAdd(context.WithoutCancel(ctx), &redis.XAddArgs{Stream: stream, Values: values}).Err()
	}
	worker.Main(
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
		}).Lock(func(p payload) string { return "lock:wait:" + p.Key }, 0).OnContention(worker.Wait(30*time.Second)),
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
	)
}
