package lock_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// BenchmarkPermitsContended: 16 goroutines cycle one key (Acquire, hold
// 1 ms, Release), as a lock (limit 1) and with limit 4, in one run. acq/s
// of limit 4 should be ≥ 3.5× limit 1's; wait-p99-ms is each acquire's wait,
// against the ideal (16/4 − 1) × (hold + hand-off) for limit 4; spread is the
// most acquisitions of one contender over the fewest (fairness).
//
//	go test -run '^$' -bench PermitsContended -benchtime 2000x ./internal/lock
func BenchmarkPermitsContended(b *testing.B) {
	const contenders, hold = 16, time.Millisecond
	srv := redistest.Start(b)
	c := srv.Client(func(o *redis.Options) { o.PoolSize = 4 * contenders })
	l := lock.New(c)
	for _, limit := range []int{1, 4} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			ctx := context.Background()
			key := fmt.Sprintf("contended-%d", limit)
			var left atomic.Int64
			left.Store(int64(b.N))
			var mu sync.Mutex
			var waits []time.Duration
			counts := make([]int, contenders)
			var wg sync.WaitGroup
			srv0, self0 := redistest.CPU(b, c), proctest.SelfCPU(b)
			b.ResetTimer()
			start := time.Now()
			for i := range contenders {
				wg.Go(func() {
					var mine []time.Duration
					for left.Add(-1) >= 0 {
						t0 := time.Now()
						lease, err := l.Acquire(ctx, key, 10*time.Second, lock.Permits(limit),
							lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: time.Second}))
						if err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
						counts[i]++
						time.Sleep(hold)
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
					mu.Lock()
					waits = append(waits, mine...)
					mu.Unlock()
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			slices.Sort(waits)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
			b.ReportMetric(float64((redistest.CPU(b, c)-srv0).Microseconds())/float64(b.N), "redis-cpu-us/op")
			b.ReportMetric(float64((proctest.SelfCPU(b)-self0).Microseconds())/float64(b.N), "client-cpu-us/op")
			if len(waits) > 0 {
				b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "wait-p99-ms")
			}
			b.ReportMetric(float64(slices.Max(counts))/float64(max(slices.Min(counts), 1)), "spread")
		})
	}
}
