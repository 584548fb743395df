package lock_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// The two benchmarks below run one acquire+release cycle per op on the same
// kind of server with 64 goroutines (each on its own key, so the figures are
// the cost of a cycle, not of waiting). Compare their ns/op in one run:
//
//	go test -run '^$' -bench 'Cycle' -benchtime 3s ./internal/lock
const benchGoroutines = 64

func benchClient(b *testing.B) *redis.Client {
	srv := redistest.Start(b)
	return srv.Client(func(o *redis.Options) { o.PoolSize = benchGoroutines * 2 })
}

func parallel64(b *testing.B, body func(key string)) {
	b.SetParallelism((benchGoroutines + 1) / max(1, runtimeProcs()))
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("bench-%d", n.Add(1))
		for pb.Next() {
			body(key)
		}
	})
}

// BenchmarkCycleRawSetNXDel is the floor: SET NX PX + DEL, no token check, no fence.
func BenchmarkCycleRawSetNXDel(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	parallel64(b, func(key string) {
		if ok, err := c.SetNX(ctx, key, "token", 30*time.Second).Result(); err != nil || !ok {
			b.Fatalf("SET NX: %v %v", ok, err)
		}
		if err := c.Del(ctx, key).Err(); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkCycleFencedLock is TryAcquire (SET NX PX + fence INCR in Lua) + Release (compare-and-DEL in Lua).
func BenchmarkCycleFencedLock(b *testing.B) {
	l := lock.New(benchClient(b))
	ctx := context.Background()
	parallel64(b, func(key string) {
		lease, err := l.TryAcquire(ctx, key, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	})
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
