package main

// limited/16: the contended loop (contended in main.go: 16 goroutines take
// one key, hold it 1ms, release) on a resource that admits 4 holders at once.
//
//   - Lockstep with Permits(4), and with Permits(1) (a lock) on the same loop
//     in the same repetition: the ratio of the two is the speed-up a limit
//     gives. Each permit has its own fence, is renewed by the watchdog like
//     a lock, and is handed to the longest waiter at release.
//   - asynq's x/rate semaphore (github.com/hibiken/asynq/x/rate, the version
//     the module proxy serves, written for go-redis v8): a sorted set of task
//     ids scored by their deadline. No fence, no renewal, no queue: Acquire
//     answers at once, so a goroutine that got false tries again after 1ms.
//     It needs the context of an asynq handler (the task id is the holder),
//     so its goroutines are 16 handlers of an asynq server started for the
//     run; its figures include that server's own Redis commands.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	redisv8 "github.com/go-redis/redis/v8"
	"github.com/hibiken/asynq"
	"github.com/hibiken/asynq/x/rate"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/benchhold"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// limit is the holders the limited runs' resource admits at once.
const limit = 4

// semaphoreRetry is how long an x/rate contender waits after a refusal.
const semaphoreRetry = time.Millisecond

func limitedPeers(addr string) []peer {
	lockstep := func(name string, n int) peer {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 160})
		cnt := &counter{}
		c.AddHook(cnt)
		locker := lock.New(c)
		return peer{name: name, cnt: cnt,
			limited: func(ctx context.Context, key string) (func() error, int, error) {
				lease, err := locker.Acquire(ctx, key, ttl, lock.Permits(n), lock.MaxWait(30*time.Second))
				if err != nil {
					return nil, 0, err
				}
				return func() error { return lease.Release(ctx) }, lease.Permit(), nil
			}}
	}
	return []peer{
		lockstep(fmt.Sprintf("Lockstep, limit %d", limit), limit),
		lockstep("Lockstep, limit 1 (a lock)", 1),
		semaphorePeer(addr),
	}
}

func semaphorePeer(addr string) peer {
	c := redisv8.NewClient(&redisv8.Options{Addr: addr, PoolSize: 160})
	cnt := &counter{}
	c.AddHook(counterV8{cnt})
	var mu sync.Mutex
	semas := map[string]*rate.Semaphore{}
	semaFor := func(key string) *rate.Semaphore {
		mu.Lock()
		defer mu.Unlock()
		if s, ok := semas[key]; ok {
			return s
		}
		s := rate.NewSemaphore(clientV8{c}, key, limit)
		semas[key] = s
		return s
	}
	return peer{name: fmt.Sprintf("asynq x/rate semaphore, %d tokens", limit), cnt: cnt,
		limited: func(ctx context.Context, key string) (func() error, int, error) {
			s := semaFor(key)
			for {
				ok, err := s.Acquire(ctx)
				if err != nil {
					return nil, 0, err
				}
				if ok {
					return func() error { return s.Release(ctx) }, -1, nil
				}
				time.Sleep(semaphoreRetry)
			}
		},
		spawn: asynqHandlers(addr)}
}

// asynqHandlers runs each goroutine of a run as a handler of an asynq server
// (Concurrency n) started for the run and shut down after it.
func asynqHandlers(addr string) spawner {
	return func(n int, f func(ctx context.Context, g int), ready func()) {
		opt := asynq.RedisClientOpt{Addr: addr}
		jobs := make(chan func(ctx context.Context))
		srv := asynq.NewServer(opt, asynq.Config{Concurrency: n, Queues: map[string]int{"peers": 1},
			LogLevel: asynq.ErrorLevel})
		if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			(<-jobs)(ctx)
			return nil
		})); err != nil {
			fail(err)
		}
		defer srv.Shutdown()
		client := asynq.NewClient(opt)
		defer client.Close()
		for range n {
			if _, err := client.Enqueue(asynq.NewTask("peers:contend", nil), asynq.Queue("peers"),
				asynq.Timeout(time.Minute), asynq.MaxRetry(0)); err != nil {
				fail(err)
			}
		}
		var wg sync.WaitGroup
		arrived, begin := make(chan struct{}, n), make(chan struct{})
		for g := range n {
			wg.Add(1)
			jobs <- func(ctx context.Context) {
				defer wg.Done()
				arrived <- struct{}{}
				<-begin
				f(ctx, g)
			}
		}
		for range n {
			<-arrived
		}
		ready()
		close(begin)
		wg.Wait()
	}
}

// clientV8 hands x/rate its go-redis v8 client (asynq.RedisConnOpt).
type clientV8 struct{ c *redisv8.Client }

func (o clientV8) MakeRedisClient() any { return o.c }

// counterV8 is counter's hook for a go-redis v8 client.
type counterV8 struct{ c *counter }

func (h counterV8) BeforeProcess(ctx context.Context, _ redisv8.Cmder) (context.Context, error) {
	h.c.cmds.Add(1)
	h.c.trips.Add(1)
	return ctx, nil
}
func (h counterV8) AfterProcess(context.Context, redisv8.Cmder) error { return nil }
func (h counterV8) BeforeProcessPipeline(ctx context.Context, cmds []redisv8.Cmder) (context.Context, error) {
	h.c.cmds.Add(int64(len(cmds)))
	h.c.trips.Add(1)
	return ctx, nil
}
func (h counterV8) AfterProcessPipeline(context.Context, []redisv8.Cmder) error { return nil }

// limitedRun is contended for a peer's limited acquire: besides the
// contended figures, hold and hand-off are per permit when the peer names
// its permits (the hand-off from a release call to the next holder of the
// same permit).
func (s server) limitedRun(p peer, n int, rep int) sample {
	key := fmt.Sprintf("limited:%s:%d:%d", p.name, n, rep)
	type pspan struct {
		permit int
		span
	}
	spans := make([][]pspan, n)
	out := s.measure(p, n, *contTime, func(ctx context.Context, g int, stop *atomic.Bool) (int64, []time.Duration) {
		var count int64
		var waits []time.Duration
		for !stop.Load() {
			t := time.Now()
			release, permit, err := p.limited(ctx, key)
			if err != nil {
				fail(fmt.Errorf("%s: %w", p.name, err))
			}
			got := time.Now()
			waits = append(waits, got.Sub(t))
			benchhold.Hold(*hold)
			rel := time.Now()
			if err := release(); err != nil {
				fail(fmt.Errorf("%s: release: %w", p.name, err))
			}
			spans[g] = append(spans[g], pspan{permit, span{got, rel}})
			count++
		}
		return count, waits
	})
	var all []pspan
	for _, ss := range spans {
		all = append(all, ss...)
	}
	slices.SortFunc(all, func(a, b pspan) int {
		if a.permit != b.permit {
			return a.permit - b.permit
		}
		return a.got.Compare(b.got)
	})
	var held time.Duration
	var gaps []time.Duration
	for i, sp := range all {
		held += sp.release.Sub(sp.got)
		if i > 0 && sp.permit >= 0 && all[i-1].permit == sp.permit {
			gaps = append(gaps, sp.got.Sub(all[i-1].release))
		}
	}
	if len(all) > 0 {
		out.hold = held / time.Duration(len(all))
	}
	if len(gaps) > 0 {
		slices.Sort(gaps)
		out.handoff = gaps[len(gaps)/2]
	}
	return out
}

func reportLimited(names []string, r map[string]map[string][]sample) {
	kind := fmt.Sprintf("limited/%d", *contenders)
	if len(r[kind]) == 0 {
		return
	}
	base := "Lockstep, limit 1 (a lock)"
	fmt.Printf("\n### %d goroutines, one key, at most %d holders, %v hold (%s); medians of %d repetitions (min–max)\n\n", *contenders, limit, *hold, benchhold.Mode(), *reps)
	fmt.Println("ideal wait p99: (goroutines/limit − 1) × (hold + hand-off), from the same repetition's hold and hand-off.")
	fmt.Println()
	fmt.Println("| peer | acquisitions/s | vs Lockstep limit 1 (same rep) | round trips/acq | server cmds/acq | wait p50 | wait p99 | p99 / ideal | acquisitions per goroutine (min–max, worst rep) | max/min | Redis CPU µs/acq | hold (mean) | release → next holder of the permit (p50) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
	for _, n := range names {
		ss := r[kind][n]
		if len(ss) == 0 {
			continue
		}
		worst := slices.MaxFunc(ss, func(a, b sample) int {
			fa, fb := float64(a.perMax)/float64(max(a.perMin, 1)), float64(b.perMax)/float64(max(b.perMin, 1))
			return cmpF(fa, fb)
		})
		holders := float64(limit)
		if n == base {
			holders = 1
		}
		ideal := "–"
		if median(each(ss, func(s sample) float64 { return float64(s.handoff) })) > 0 {
			ideal = spread(each(ss, func(s sample) float64 {
				return float64(s.p99) / ((float64(*contenders)/holders - 1) * float64(s.hold+s.handoff))
			}), "%.2f×")
		}
		handoff := ms(median(each(ss, func(s sample) float64 { return float64(s.handoff) })))
		if ideal == "–" {
			handoff = "–" // the peer names no permit
		}
		fmt.Printf("| %s | %s | %s | %.2f | %.2f | %s | %s | %s | %d–%d | %s | %.1f | %s | %s |\n", n,
			spread(each(ss, sample.rate), "%.0f"),
			spread(ratio(ss, r[kind][base]), "%.2f×"),
			median(each(ss, func(s sample) float64 { return s.per(s.trips) })),
			median(each(ss, func(s sample) float64 { return s.per(s.serverCmds) })),
			ms(median(each(ss, func(s sample) float64 { return float64(s.p50) }))),
			spread(each(ss, func(s sample) float64 { return float64(s.p99) / 1e6 }), "%.1f ms"),
			ideal,
			worst.perMin, worst.perMax,
			spread(each(ss, func(s sample) float64 { return float64(s.perMax) / float64(max(s.perMin, 1)) }), "%.2f"),
			median(each(ss, func(s sample) float64 { return float64(s.cpu.Microseconds()) / float64(max(s.ops, 1)) })),
			ms(median(each(ss, func(s sample) float64 { return float64(s.hold) }))),
			handoff)
	}
}
