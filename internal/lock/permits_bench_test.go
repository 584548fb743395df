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
// against the ideal (16/4 − 1) × (hold + hand-off) for limit 4, with
// hold-ms (mean, from an acquire's return to its release call) and
// handoff-ms (p50, from a release call to the acquire's return of the next
// holder of the same permit) measured in the run; spread is the most
// acquisitions of one contender over the fewest (fairness); trips/op the
// client's round trips (a command or a pipeline) per acquisition, its
// release included, and server-cmds/op the commands Redis ran (scripts'
// own included).
//
//	go test -run '^$' -bench PermitsContended -benchtime 5000x ./internal/lock
func BenchmarkPermitsContended(b *testing.B) {
	const contenders, hold = 16, time.Millisecond
	srv := redistest.Start(b)
	c := srv.Client(func(o *redis.Options) { o.PoolSize = 4 * contenders })
	trips := &roundTrips{}
	c.AddHook(trips)
	l := lock.New(c)
	for _, limit := range []int{1, 4} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			ctx := context.Background()
			key := fmt.Sprintf("contended-%d", limit)
			var left atomic.Int64
			left.Store(int64(b.N))
			var mu sync.Mutex
			var waits []time.Duration
			var spans []permitSpan
			counts := make([]int, contenders)
			var wg sync.WaitGroup
			cmds0 := serverCommands(b, c)
			srv0, self0, trips0 := redistest.CPU(b, c), proctest.SelfCPU(b), trips.n.Load()
			b.ResetTimer()
			start := time.Now()
			for i := range contenders {
				wg.Go(func() {
					var mine []time.Duration
					var held []permitSpan
					for left.Add(-1) >= 0 {
						t0 := time.Now()
						lease, err := l.Acquire(ctx, key, 10*time.Second, lock.Permits(limit),
							lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: time.Second}))
						if err != nil {
							b.Error(err)
							return
						}
						got := time.Now()
						mine = append(mine, got.Sub(t0))
						counts[i]++
						time.Sleep(hold)
						rel := time.Now()
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
							return
						}
						held = append(held, permitSpan{lease.Permit(), got, rel})
					}
					mu.Lock()
					waits = append(waits, mine...)
					spans = append(spans, held...)
					mu.Unlock()
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			ops := float64(b.N)
			b.ReportMetric(float64(trips.n.Load()-trips0)/ops, "trips/op")
			b.ReportMetric(float64(serverCommands(b, c)-cmds0-1)/ops, "server-cmds/op") // -1: the INFO cpu
			slices.Sort(waits)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
			b.ReportMetric(float64((redistest.CPU(b, c)-srv0).Microseconds())/float64(b.N), "redis-cpu-us/op")
			b.ReportMetric(float64((proctest.SelfCPU(b)-self0).Microseconds())/float64(b.N), "client-cpu-us/op")
			if len(waits) > 0 {
				b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "wait-p99-ms")
			}
			b.ReportMetric(float64(slices.Max(counts))/float64(max(slices.Min(counts), 1)), "spread")
			holdMean, handoff := holdAndHandoff(spans)
			b.ReportMetric(float64(holdMean.Microseconds())/1000, "hold-ms")
			b.ReportMetric(float64(handoff.Microseconds())/1000, "handoff-ms")
		})
	}
}

// permitSpan is one hold of a permit: from the acquire's return to the
// release call.
type permitSpan struct {
	permit       int
	got, release time.Time
}

// holdAndHandoff returns the mean hold of spans and the median gap from a
// release call to the next hold of the same permit.
func holdAndHandoff(spans []permitSpan) (hold, handoff time.Duration) {
	if len(spans) == 0 {
		return 0, 0
	}
	slices.SortFunc(spans, func(a, b permitSpan) int {
		if a.permit != b.permit {
			return a.permit - b.permit
		}
		return a.got.Compare(b.got)
	})
	var sum time.Duration
	var gaps []time.Duration
	for i, sp := range spans {
		sum += sp.release.Sub(sp.got)
		if i > 0 && spans[i-1].permit == sp.permit {
			gaps = append(gaps, sp.got.Sub(spans[i-1].release))
		}
	}
	slices.Sort(gaps)
	if len(gaps) > 0 {
		handoff = gaps[len(gaps)/2]
	}
	return sum / time.Duration(len(spans)), handoff
}

// roundTrips counts a client's round trips: a command or a pipeline each.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// serverCommands is the number of commands the server ran so far, scripts'
// own included (INFO commandstats; the INFO itself counts from the next).
func serverCommands(b *testing.B, c *redis.Client) int64 {
	stats, err := commandStats(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for name, calls := range stats {
		if name != "info" {
			n += calls
		}
	}
	return n
}
