// Command ignorer is a worker for the tests: its one handler, test:ignore,
// works for work_ms ignoring its context (as a careless handler would), then
// records that it ran and returns nil.
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
	worker.Main(worker.Handle("test:ignore", func(ctx context.Context, job worker.Job, p payload) error {
		time.Sleep(time.Duration(p.WorkMS) * time.Millisecond) // ignores ctx
		return rdb.XAdd(context.WithoutCancel(ctx), &redis.XAddArgs{
			Stream: "test:ignorer:runs",
			Values: []any{"task_id", job.ID, "fence", job.Fence},
		}).Err()
	}).Lock(func(p payload) string { return "lock:ignore:" + p.Key }, 0))
}
