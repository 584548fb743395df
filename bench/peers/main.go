// Command peers puts Lockstep's lock next to its peers in one run, on one
// redis-server it starts itself: raw go-redis (SET NX PX + DEL, no token
// check, no fence: the floor), github.com/bsm/redislock,
// github.com/go-redsync/redsync/v4 (one pool) and Lockstep (internal/lock);
// and Lockstep's rate limit beside github.com/go-redis/redis_rate (rate.go).
// The peers are requirements of this module only, never of Lockstep's.
//
//   - cycle/1 and cycle/64: acquire + release as fast as possible, each
//     goroutine on a key of its own (no waiting).
//   - contended/16: 16 goroutines take one key with a wait, hold it 1ms
//     (benchhold.Hold: the same length whatever the traffic, where
//     time.Sleep's grows with it; LOCKSTEP_BENCH_HOLD=sleep uses time.Sleep),
//     release; alone/1 is one goroutine doing the same loop, for the
//     throughput ratio. A waiter served in arrival order waits for the
//     holds and hand-offs ahead of it, so the table also splits a cycle of
//     the lock into the hold (the 1ms and the kernel's timer slack) and the
//     hand-off (from a release call to the next holder's acquire return).
//   - limited/16 (limited.go): the contended loop on a resource of 4
//     holders at once: Lockstep with Permits(4), beside Lockstep with
//     Permits(1) in the same repetition, and asynq's x/rate semaphore.
//
// Repetitions are interleaved (every peer once per repetition) so that the
// load of a shared machine spreads over all of them; the uncontended runs
// are short (200ms) and repeated 25 times over the whole run, since a
// second's load on a shared machine can halve a one-goroutine cycle rate.
// Figures are medians, with the spread (min–max) over repetitions. Client commands and round
// trips are counted by a go-redis hook (a pipeline is one round trip);
// server commands (scripts' inner commands included) and Redis CPU come
// from INFO commandstats and INFO cpu.
//
//	make bench-peers            # or: cd bench/peers && go run . -reps 5
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/benchhold"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

var (
	reps       = flag.Int("reps", 5, "interleaved repetitions of the contended runs")
	cycleReps  = flag.Int("cycle-reps", 25, "interleaved repetitions of the uncontended runs")
	cycleTime  = flag.Duration("cycle", 200*time.Millisecond, "length of one uncontended run")
	contTime   = flag.Duration("contended", 2*time.Second, "length of one contended run")
	contenders = flag.Int("contenders", 16, "goroutines of the contended runs")
	hold       = flag.Duration("hold", time.Millisecond, "hold time of the contended runs")
	only       = flag.String("only", "", "run only the runs whose name contains this (e.g. contended)")
)

// counter counts the commands and round trips a client sends.
type counter struct{ cmds, trips atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		c.trips.Add(1)
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.cmds.Add(int64(len(cmds)))
		c.trips.Add(1)
		return next(ctx, cmds)
	}
}

// peer is one lock implementation: cycle takes and frees key once without
// waiting; wait takes it, waiting as the library does, and returns the
// release; limited does the same for a resource of several holders at once
// (limited.go) and says which permit it got (-1: the library does not say).
// spawn, when set, runs the goroutines of a run where the library needs
// them (see limited.go); nil: plain goroutines.
type peer struct {
	name    string
	cnt     *counter
	cycle   func(ctx context.Context, key string) error
	wait    func(ctx context.Context, key string) (func() error, error)
	limited func(ctx context.Context, key string) (release func() error, permit int, err error)
	allow   allowFunc // a rate limiter (rate.go)
	spawn   spawner
}

// A spawner runs f(ctx, g) for g from 0 to n-1 at once, each on a
// goroutine, calls ready just before the first f starts (when every
// goroutine is there), and returns when every f has.
type spawner func(n int, f func(ctx context.Context, g int), ready func())

func goroutines(n int, f func(ctx context.Context, g int), ready func()) {
	ready()
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { f(context.Background(), g) })
	}
	wg.Wait()
}

const ttl = 30 * time.Second

func peers(addr string) []peer {
	client := func() (*redis.Client, *counter) {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 160})
		cnt := &counter{}
		c.AddHook(cnt)
		return c, cnt
	}
	var out []peer

	raw, rawCnt := client()
	out = append(out, peer{name: "raw SET NX PX + DEL", cnt: rawCnt,
		cycle: func(ctx context.Context, key string) error {
			ok, err := raw.SetNX(ctx, key, "token", ttl).Result()
			if err != nil || !ok {
				return fmt.Errorf("SET NX: %v %v", ok, err)
			}
			return raw.Del(ctx, key).Err()
		}})

	rl, rlCnt := client()
	bsm := redislock.New(rl)
	backoff := &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond)}
	out = append(out, peer{name: "bsm/redislock v0.9.4", cnt: rlCnt,
		cycle: func(ctx context.Context, key string) error {
			l, err := bsm.Obtain(ctx, key, ttl, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		wait: func(ctx context.Context, key string) (func() error, error) {
			l, err := bsm.Obtain(ctx, key, ttl, backoff)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}})

	rs, rsCnt := client()
	rsync := redsync.New(goredis.NewPool(rs))
	out = append(out, peer{name: "redsync v4.18.1", cnt: rsCnt,
		cycle: func(ctx context.Context, key string) error {
			m := rsync.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			_, err := m.UnlockContext(ctx)
			return err
		},
		wait: func(ctx context.Context, key string) (func() error, error) {
			m := rsync.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1<<20))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error { _, err := m.UnlockContext(ctx); return err }, nil
		}})

	// The textbook fenced lock in Lua, a server's floor for one: SET NX PX
	// and an INCR of a fencing counter in one script, a compare-and-delete
	// in another (no queue, no reentrancy, no fence floor or clock).
	lf, lfCnt := client()
	fenceLock := redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0`)
	fenceUnlock := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	out = append(out, peer{name: "Lua SET NX PX + INCR / compare-and-delete", cnt: lfCnt,
		cycle: func(ctx context.Context, key string) error {
			keys := []string{"{" + key + "}", "{" + key + "}:fence"}
			fence, err := fenceLock.Run(ctx, lf, keys, "token", ttl.Milliseconds()).Int64()
			if err != nil || fence == 0 {
				return fmt.Errorf("fenced SET NX: %v %v", fence, err)
			}
			return fenceUnlock.Run(ctx, lf, keys[:1], "token").Err()
		}})

	ls, lsCnt := client()
	locker := lock.New(ls)
	out = append(out, peer{name: "Lockstep TryAcquire + Release", cnt: lsCnt,
		cycle: func(ctx context.Context, key string) error {
			lease, err := locker.TryAcquire(ctx, key, ttl)
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		},
		wait: func(ctx context.Context, key string) (func() error, error) {
			lease, err := locker.Acquire(ctx, key, ttl, lock.MaxWait(30*time.Second))
			if err != nil {
				return nil, err
			}
			return func() error { return lease.Release(ctx) }, nil
		}})

	// lockstep.WithLock as a user calls it: the watchdog and loss notices
	// on, tracing off.
	lw, lwCnt := client()
	withLock := lockstep.NewLocker(lw)
	noop := func(context.Context, *lockstep.Lease) error { return nil }
	out = append(out, peer{name: "Lockstep WithLock", cnt: lwCnt,
		cycle: func(ctx context.Context, key string) error {
			return withLock.WithLock(ctx, key, noop, lockstep.TTL(ttl))
		}})
	return out
}

// sample is one run's figures.
type sample struct {
	ops                     int64
	elapsed                 time.Duration
	cmds, trips, serverCmds int64
	cpu                     time.Duration // Redis's
	self                    time.Duration // this process's (the peer's client code)
	p50, p99                time.Duration // contended: wait for the lock
	perMin, perMax          int64         // contended: acquisitions per goroutine
	// contended: where a wait goes. With the lock held by one goroutine at a
	// time, a waiter's wait is the holds and hand-offs ahead of it: hold is
	// the mean time from an acquire's return to its release call (the 1ms
	// sleep and its overshoot), handoff the median time from a release call
	// to the next holder's acquire returning.
	hold, handoff time.Duration
	// rate runs (rate.go): ops are the admissions, decisions every call;
	// over-granted windows by the client's times and (-1: unknown) by the
	// server's.
	decisions                 int64
	overGrant, overGrantExact int
}

func (s sample) rate() float64       { return float64(s.ops) / s.elapsed.Seconds() }
func (s sample) per(n int64) float64 { return float64(n) / float64(max(s.ops, 1)) }

type server struct{ admin *redis.Client }

func (s server) stats(ctx context.Context) (calls int64, cpu time.Duration) {
	info, err := s.admin.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		fail(err)
	}
	var secs float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			secs += f
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			for _, kv := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(kv, "calls="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					calls += c
				}
			}
		}
	}
	return calls, time.Duration(secs * float64(time.Second))
}

// measure runs body on goroutines until d passes and fills in the counts.
func (s server) measure(p peer, n int, d time.Duration, body func(ctx context.Context, g int, stop *atomic.Bool) (int64, []time.Duration)) sample {
	ctx := context.Background()
	var calls0, cmds0, trips0 int64
	var cpu0, self0 time.Duration
	var stop atomic.Bool
	counts := make([]int64, n)
	waits := make([][]time.Duration, n)
	var start time.Time
	var timer *time.Timer
	spawn := p.spawn
	if spawn == nil {
		spawn = goroutines
	}
	spawn(n, func(ctx context.Context, g int) { counts[g], waits[g] = body(ctx, g, &stop) }, func() {
		calls0, cpu0 = s.stats(ctx)
		cmds0, trips0 = p.cnt.cmds.Load(), p.cnt.trips.Load()
		self0 = processCPU()
		start = time.Now()
		timer = time.AfterFunc(d, func() { stop.Store(true) })
	})
	timer.Stop()
	out := sample{elapsed: time.Since(start), self: processCPU() - self0}
	calls1, cpu1 := s.stats(ctx)
	out.cmds, out.trips = p.cnt.cmds.Load()-cmds0, p.cnt.trips.Load()-trips0
	out.serverCmds, out.cpu = calls1-calls0-1, cpu1-cpu0 // -1: the INFO before is counted
	out.perMin, out.perMax = counts[0], counts[0]
	var all []time.Duration
	for g, n := range counts {
		out.ops += n
		out.perMin, out.perMax = min(out.perMin, n), max(out.perMax, n)
		all = append(all, waits[g]...)
	}
	if len(all) > 0 {
		slices.Sort(all)
		out.p50, out.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	return out
}

func (s server) cycle(p peer, goroutines int, rep int) sample {
	return s.measure(p, goroutines, *cycleTime, func(ctx context.Context, g int, stop *atomic.Bool) (int64, []time.Duration) {
		key := fmt.Sprintf("cycle:%s:%d:%d", p.name, rep, g)
		var n int64
		for !stop.Load() {
			if err := p.cycle(ctx, key); err != nil {
				fail(fmt.Errorf("%s: %w", p.name, err))
			}
			n++
		}
		return n, nil
	})
}

// span is one holder's time with the lock: from its acquire's return to its
// release call.
type span struct{ got, release time.Time }

func (s server) contended(p peer, goroutines int, rep int) sample {
	key := fmt.Sprintf("hot:%s:%d:%d", p.name, goroutines, rep)
	spans := make([][]span, goroutines)
	out := s.measure(p, goroutines, *contTime, func(ctx context.Context, g int, stop *atomic.Bool) (int64, []time.Duration) {
		var n int64
		var waits []time.Duration
		for !stop.Load() {
			t := time.Now()
			release, err := p.wait(ctx, key)
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
			spans[g] = append(spans[g], span{got, rel})
			n++
		}
		return n, waits
	})
	var all []span
	for _, ss := range spans {
		all = append(all, ss...)
	}
	slices.SortFunc(all, func(a, b span) int { return a.got.Compare(b.got) })
	var held time.Duration
	var gaps []time.Duration
	for i, sp := range all {
		held += sp.release.Sub(sp.got)
		if i > 0 {
			gaps = append(gaps, sp.got.Sub(all[i-1].release))
		}
	}
	if len(all) > 1 {
		out.hold = held / time.Duration(len(all))
		slices.Sort(gaps)
		out.handoff = gaps[len(gaps)/2]
	}
	return out
}

func main() {
	flag.Parse()
	addr, stopRedis := startRedis()
	defer stopRedis()
	srv := server{admin: redis.NewClient(&redis.Options{Addr: addr})}
	ps := append(append(peers(addr), limitedPeers(addr)...), ratePeers(addr)...)
	var names []string
	for _, p := range ps {
		names = append(names, p.name)
	}
	kinds := []struct {
		name string
		reps int
		run  func(p peer, rep int) sample
		only func(p peer) bool
	}{
		{"cycle/1", *cycleReps, func(p peer, rep int) sample { return srv.cycle(p, 1, rep) }, func(p peer) bool { return p.cycle != nil }},
		{"cycle/64", *cycleReps, func(p peer, rep int) sample { return srv.cycle(p, 64, rep) }, func(p peer) bool { return p.cycle != nil }},
		{fmt.Sprintf("contended/%d", *contenders), *reps, func(p peer, rep int) sample { return srv.contended(p, *contenders, rep) },
			func(p peer) bool { return p.wait != nil }},
		{"alone/1", *reps, func(p peer, rep int) sample { return srv.contended(p, 1, rep) }, func(p peer) bool { return p.wait != nil }},
		{fmt.Sprintf("limited/%d", *contenders), *reps, func(p peer, rep int) sample { return srv.limitedRun(p, *contenders, rep) },
			func(p peer) bool { return p.limited != nil }},
		{"rate/1", *cycleReps, func(p peer, rep int) sample { return srv.rateRun(p, 1, false, *cycleTime, rep) }, func(p peer) bool { return p.allow != nil }},
		{"rate/64", *cycleReps, func(p peer, rep int) sample { return srv.rateRun(p, 64, false, *cycleTime, rep) }, func(p peer) bool { return p.allow != nil }},
		{"rate-binding/64", *reps, func(p peer, rep int) sample { return srv.rateRun(p, 64, true, *contTime, rep) }, func(p peer) bool { return p.allow != nil }},
	}
	results := map[string]map[string][]sample{}
	for _, k := range kinds {
		results[k.name] = map[string][]sample{}
	}
	fmt.Fprintf(os.Stderr, "redis-server %s, %d repetitions (uncontended runs: %d)\n", redisVersion(srv), *reps, *cycleReps)
	// Short uncontended runs, many times over: on a shared machine the load
	// changes from one second to the next, and a peer's run should not land
	// on a busier second than its neighbours' more often than theirs.
	total := max(*reps, *cycleReps)
	for rep := range total {
		for _, k := range kinds {
			if !strings.Contains(k.name, *only) && !(*only == "contended" && k.name == "alone/1") {
				continue
			}
			// Spread a kind's repetitions evenly over the whole run.
			if rep*k.reps/total == (rep+1)*k.reps/total {
				continue
			}
			for _, p := range ps {
				if !k.only(p) {
					continue
				}
				// Rotate the order each repetition: no peer always runs first.
				results[k.name][p.name] = append(results[k.name][p.name], k.run(p, rep))
			}
			ps = append(ps[1:], ps[0])
		}
		fmt.Fprintf(os.Stderr, "repetition %d of %d done\n", rep+1, total)
	}
	report(names, results)
	reportLimited(names, results)
	reportRate(names, results)
	if *only == "" || *only == "fair" {
		reportFair(fairScenario(addr))
	}
}

// processCPU returns this process's user+sys CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fail(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
