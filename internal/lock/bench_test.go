package lock_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
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

// parallel64 runs body from 64 goroutines and reports, besides ns/op, the CPU
// each cycle costs the Redis server and this process: on a 2-core machine
// where both share the CPUs, their sum decides throughput, and it is far less
// noisy than wall time when other work runs.
func parallel64(b *testing.B, c *redis.Client, body func(key string)) {
	b.SetParallelism((benchGoroutines + 1) / max(1, runtimeProcs()))
	var n atomic.Int64
	srv0, self0 := redistest.CPU(b, c), proctest.SelfCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("bench-%d", n.Add(1))
		for pb.Next() {
			body(key)
		}
	})
	b.StopTimer()
	ops := float64(b.N)
	b.ReportMetric(float64((redistest.CPU(b, c)-srv0).Microseconds())/ops, "redis-cpu-us/op")
	b.ReportMetric(float64((proctest.SelfCPU(b)-self0).Microseconds())/ops, "client-cpu-us/op")
}

// BenchmarkCycleRawSetNXDel is the floor: SET NX PX + DEL, no token check, no fence.
func BenchmarkCycleRawSetNXDel(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	parallel64(b, c, func(key string) {
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
	c := benchClient(b)
	l := lock.New(c)
	ctx := context.Background()
	parallel64(b, c, func(key string) {
		lease := mustAcquire(b, ctx, l, key, 30*time.Second)
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkCyclePermits is BenchmarkCycleFencedLock's cycle (TryAcquire +
// Release, each goroutine on its own key) for a resource with a limit of 3
// beside the lock's, at 1 and at 64 goroutines, on one server. The two take
// turns in 5 rounds of b.N/5 cycles each, so that both see the same load of
// a shared machine; x is the permit's cycles/s over the lock's (target
// ≥ 0.9), and each reports its ns per cycle and Redis and client CPU.
//
//	go test -run '^$' -bench 'CyclePermits' -benchtime 20000x ./internal/lock
func BenchmarkCyclePermits(b *testing.B) {
	const rounds = 5
	c := benchClient(b)
	l := lock.New(c)
	ctx := context.Background()
	kinds := []struct {
		name string
		opts []lock.AcquireOption
	}{{"lock", nil}, {"limit3", []lock.AcquireOption{lock.Permits(3)}}}
	for _, goroutines := range []int{1, benchGoroutines} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			type tally struct{ elapsed, redisCPU, self time.Duration }
			tallies := make([]tally, len(kinds))
			// run makes n cycles of kind k on goroutines keys of its own.
			run := func(k, n int) {
				var left atomic.Int64
				left.Store(int64(n))
				srv0, self0 := redistest.CPU(b, c), proctest.SelfCPU(b)
				start := time.Now()
				var wg sync.WaitGroup
				for g := range goroutines {
					key := fmt.Sprintf("bench-%s-%d", kinds[k].name, g)
					wg.Go(func() {
						for left.Add(-1) >= 0 {
							lease, err := l.TryAcquire(ctx, key, 30*time.Second, kinds[k].opts...)
							if err != nil {
								b.Error(err)
								return
							}
							if err := lease.Release(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				t := &tallies[k]
				t.elapsed += time.Since(start)
				t.redisCPU += redistest.CPU(b, c) - srv0
				t.self += proctest.SelfCPU(b) - self0
			}
			b.ResetTimer()
			for r := range rounds {
				for k := range kinds {
					run(k, b.N*(r+1)/rounds-b.N*r/rounds)
				}
			}
			b.StopTimer()
			ops := float64(b.N)
			b.ReportMetric(tallies[0].elapsed.Seconds()/tallies[1].elapsed.Seconds(), "x")
			for k, kind := range kinds {
				t := tallies[k]
				b.ReportMetric(float64(t.elapsed.Nanoseconds())/ops, kind.name+"-ns/cycle")
				b.ReportMetric(float64(t.redisCPU.Microseconds())/ops, kind.name+"-redis-cpu-us")
				b.ReportMetric(float64(t.self.Microseconds())/ops, kind.name+"-client-cpu-us")
			}
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// BenchmarkRenew10k renews 10,000 held leases per op: batched (RenewAll: Lua
// batches of 1,000 in one pipeline) against one EVALSHA per lease (pipelined,
// so the difference is Redis CPU, and sequential, the naive renewer).
// redis-cpu-ms/op is the server's user+sys CPU per round, from INFO cpu.
//
//	go test -run '^$' -bench Renew10k -benchtime 20x ./internal/lock
func BenchmarkRenew10k(b *testing.B) {
	const n = 10_000
	srv := redistest.Start(b)
	c := srv.Client(func(o *redis.Options) { o.PoolSize = 16 })
	l := lock.New(c)
	ctx := context.Background()
	leases := acquireN(b, l, "renew-", n)
	round := map[string]func(){
		"batched": func() {
			for i, err := range l.RenewAll(ctx, leases) {
				if err != nil {
					b.Fatalf("lease %d: %v", i, err)
				}
			}
		},
		"evalsha-pipelined": func() {
			cmds := make([]*redis.Cmd, n)
			_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, s := range leases {
					cmds[i] = lock.RenewScript().EvalSha(ctx, p, []string{s.RedisKey(), s.RedisKey() + ":owners", s.RedisKey() + ":fence"},
						s.Token(), s.TTL().Milliseconds(), "", (s.TTL() + lock.DefaultFenceTTL).Milliseconds())
				}
				return nil
			})
			for i, cmd := range cmds {
				if v, err := cmd.Int64(); err != nil || v != 1 {
					b.Fatalf("lease %d: %v %v", i, v, err)
				}
			}
		},
		"evalsha-sequential": func() {
			for i, s := range leases {
				if err := s.Renew(ctx); err != nil {
					b.Fatalf("lease %d: %v", i, err)
				}
			}
		},
	}
	for _, name := range []string{"batched", "evalsha-pipelined", "evalsha-sequential"} {
		b.Run(name, func(b *testing.B) {
			if err := lock.RenewScript().Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
			round[name]() // warm up: scripts loaded, connections open
			cpu0 := redistest.CPU(b, c)
			b.ResetTimer()
			for range b.N {
				round[name]()
			}
			b.StopTimer()
			b.ReportMetric((redistest.CPU(b, c)-cpu0).Seconds()*1000/float64(b.N), "redis-cpu-ms/op")
		})
	}
}

// commandStats returns the server's calls per command (INFO commandstats).
func commandStats(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				out[name], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out, nil
}

// BenchmarkRenewAtScale renews every lease one process holds, as the
// watchdog does each round (RenewAll: Lua batches of lock.BatchSize in one
// pipeline), at 10,000 and 100,000 leases, so that the growth of the cost
// shows: the server's CPU per round (INFO cpu) and its longest single call
// in the round (SLOWLOG, calls of 100 µs and more logged while the rounds
// run).
//
//	go test -run '^$' -bench RenewAtScale -benchtime 5x ./internal/lock
func BenchmarkRenewAtScale(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			srv := redistest.Start(b)
			c := srv.Client(func(o *redis.Options) { o.PoolSize = 64 })
			l := lock.New(c)
			ctx := context.Background()
			leases := make([]*lock.Lease, n)
			var wg sync.WaitGroup
			for g := range 32 { // concurrent acquires share script calls
				wg.Go(func() {
					for i := g; i < n; i += 32 {
						var err error
						if leases[i], err = l.TryAcquire(ctx, fmt.Sprintf("renew-%d", i), time.Minute); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if b.Failed() {
				b.FailNow()
			}
			renew := func() {
				for i, err := range l.RenewAll(ctx, leases) {
					if err != nil {
						b.Fatalf("lease %d: %v", i, err)
					}
				}
			}
			renew() // warm up: scripts loaded, connections open
			// Calls of 100 µs and more are logged: every batch call, none of
			// the commands inside one (which the slow log would list too).
			if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "100").Err(); err != nil {
				b.Fatal(err)
			}
			c.ConfigSet(ctx, "slowlog-max-len", "100000")
			c.SlowLogReset(ctx)
			cpu0 := redistest.CPU(b, c)
			b.ResetTimer()
			for range b.N {
				renew()
			}
			b.StopTimer()
			cpu := redistest.CPU(b, c) - cpu0
			log, err := c.SlowLogGet(ctx, -1).Result()
			if err != nil {
				b.Fatal(err)
			}
			var longest time.Duration
			calls := 0
			for _, e := range log {
				if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "evalsha") {
					longest, calls = max(longest, e.Duration), calls+1
				}
			}
			b.ReportMetric(cpu.Seconds()*1000/float64(b.N), "redis-cpu-ms/round")
			b.ReportMetric(float64(longest.Microseconds()), "longest-call-us")
			b.ReportMetric(float64(calls)/float64(b.N), "calls/round")
		})
	}
}
