package main

// rate/1, rate/64 and rate-binding/64: Lockstep's rate limit per key
// (Locker.Allow, GCRA in one script on the server's clock) beside
// github.com/go-redis/redis_rate/v10 (GCRA in one script too) on the same
// redis-server, interleaved with the other runs.
//
//   - rate/1 and rate/64: decisions as fast as possible, each goroutine on a
//     key of its own under a limit it never reaches (a million a second), so
//     that every decision is an admission: admissions/s and Redis CPU per
//     admission.
//   - rate-binding/64: 64 goroutines on one key under 1000 a second, burst
//     20, as fast as they can: what was admitted, and the over-grant. A
//     window between two admissions is over-granted when it holds more than
//     N·w/Per + Burst of them. Each admission's server time lies between its
//     call's send and its reply, so a window's length is at most the last
//     reply less the first send: counted that way an over-grant is certain,
//     for any limiter (the same check for both). Lockstep's Allow also
//     returns the server's time of each admission (AllowAt), checked exactly.

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A rate limit as the runs use it: n per per, burst.
type rateLimit struct {
	n     int
	per   time.Duration
	burst int
}

var (
	openLimit    = rateLimit{n: 1_000_000, per: time.Second, burst: 1_000_000}
	bindingLimit = rateLimit{n: 1000, per: time.Second, burst: 20}
)

// ratePeerName is redis_rate's row, the baseline of the rate tables.
const ratePeerName = "go-redis/redis_rate v10.0.1"

// allowFunc decides one event on key under lim: admitted or not, and (zero
// when the limiter does not say) the server's time of the decision.
type allowFunc func(ctx context.Context, key string, lim rateLimit) (bool, time.Time, error)

func ratePeers(addr string) []peer {
	client := func() (*redis.Client, *counter) {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 160})
		cnt := &counter{}
		c.AddHook(cnt)
		return c, cnt
	}
	rr, rrCnt := client()
	limiter := redis_rate.NewLimiter(rr)
	ls, lsCnt := client()
	locker := lock.New(ls)
	return []peer{
		{name: ratePeerName, cnt: rrCnt,
			allow: func(ctx context.Context, key string, lim rateLimit) (bool, time.Time, error) {
				res, err := limiter.Allow(ctx, key, redis_rate.Limit{Rate: lim.n, Period: lim.per, Burst: lim.burst})
				if err != nil {
					return false, time.Time{}, err
				}
				return res.Allowed > 0, time.Time{}, nil
			}},
		{name: "Lockstep Allow", cnt: lsCnt,
			allow: func(ctx context.Context, key string, lim rateLimit) (bool, time.Time, error) {
				wait, at, err := locker.AllowAt(ctx, key, lock.Rate{N: lim.n, Per: lim.per, Burst: lim.burst})
				return wait == 0, at, err
			}},
	}
}

// call is one admitted call: sent, replied, and the server's time if known.
type call struct{ sent, replied, at time.Time }

// rateRun runs goroutines deciding as fast as they can for d: on keys of
// their own under openLimit, or all on one key under bindingLimit.
func (s server) rateRun(p peer, goroutines int, binding bool, d time.Duration, rep int) sample {
	lim := openLimit
	if binding {
		lim = bindingLimit
	}
	admitted := make([][]call, goroutines)
	var decisions atomic.Int64
	out := s.measure(p, goroutines, d, func(ctx context.Context, g int, stop *atomic.Bool) (int64, []time.Duration) {
		key := fmt.Sprintf("rate:%s:%d:%d:%d", p.name, goroutines, rep, g)
		if binding {
			key = fmt.Sprintf("rate:%s:binding:%d", p.name, rep)
		}
		var n int64
		for !stop.Load() {
			sent := time.Now()
			ok, at, err := p.allow(ctx, key, lim)
			if err != nil {
				fail(fmt.Errorf("%s: %w", p.name, err))
			}
			decisions.Add(1)
			if ok {
				admitted[g] = append(admitted[g], call{sent, time.Now(), at})
				n++
			}
		}
		return n, nil
	})
	out.decisions = decisions.Load()
	if binding {
		var all []call
		for _, cs := range admitted {
			all = append(all, cs...)
		}
		out.overGrant = overGrants(all, lim, func(c call) (time.Time, time.Time) { return c.sent, c.replied })
		out.overGrantExact = -1
		if len(all) > 0 && !all[0].at.IsZero() {
			out.overGrantExact = overGrants(all, lim, func(c call) (time.Time, time.Time) { return c.at, c.at })
		}
	}
	return out
}

// overGrants counts the admissions that start an over-granted window: a
// run of admissions (in order of their earliest possible time) more than
// N·w/Per + Burst of them, w the longest the window can be (the latest
// possible time of any of them less the earliest of the first).
func overGrants(all []call, lim rateLimit, span func(call) (first, last time.Time)) int {
	slices.SortFunc(all, func(a, b call) int {
		x, _ := span(a)
		y, _ := span(b)
		return x.Compare(y)
	})
	over := 0
	for i := range all {
		from, latest := span(all[i])
		for j := i; j < len(all); j++ {
			if _, l := span(all[j]); l.After(latest) {
				latest = l
			}
			w := latest.Sub(from)
			// count ≤ N·w/Per + Burst, in integers: (count − Burst)·Per ≤ N·w
			if count := j - i + 1; int64(count-lim.burst)*int64(lim.per) > int64(lim.n)*int64(w) {
				over++
				break
			}
		}
	}
	return over
}

// reportRate prints the rate tables: every rate peer beside redis_rate.
func reportRate(names []string, r map[string]map[string][]sample) {
	if len(r["rate/1"]) == 0 && len(r["rate-binding/64"]) == 0 {
		return
	}
	base := r["rate/1"][ratePeerName]
	if len(base) > 0 {
		fmt.Printf("\n### Rate limit decisions, each goroutine on its own key under a limit it never reaches (every decision an admission); medians of %d interleaved repetitions of %v (min–max)\n\n", *cycleReps, *cycleTime)
		fmt.Println("| limiter | goroutines | admissions/s | vs redis_rate | round trips/admission | server cmds/admission | Redis CPU µs/admission | client CPU µs/admission |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, kind := range []string{"rate/1", "rate/64"} {
			for _, n := range names {
				ss := r[kind][n]
				if len(ss) == 0 {
					continue
				}
				fmt.Printf("| %s | %s | %s | %s | %.2f | %.2f | %.1f | %.1f |\n", n, kind[len("rate/"):],
					spread(each(ss, sample.rate), "%.0f"),
					spread(ratio(ss, r[kind][ratePeerName]), "%.2f×"),
					median(each(ss, func(s sample) float64 { return s.per(s.trips) })),
					median(each(ss, func(s sample) float64 { return s.per(s.serverCmds) })),
					median(each(ss, func(s sample) float64 { return float64(s.cpu.Microseconds()) / float64(max(s.ops, 1)) })),
					median(each(ss, func(s sample) float64 { return float64(s.self.Microseconds()) / float64(max(s.ops, 1)) })))
			}
		}
	}
	kind := "rate-binding/64"
	if len(r[kind]) == 0 {
		return
	}
	fmt.Printf("\n### 64 goroutines on one key under %d per %v, burst %d, as fast as they can; %d repetitions of %v\n\n", bindingLimit.n, bindingLimit.per, bindingLimit.burst, *reps, *contTime)
	fmt.Println("bound: N·run/Per + Burst admissions over the run. Over-granted windows: admissions that start a window holding more than N·w/Per + Burst, w the widest the window can be by the client's send and reply times (certain over-grants, any limiter); exact: by the server's time of each admission (Lockstep's AllowAt).")
	fmt.Println()
	fmt.Println("| limiter | decisions/s | admitted/s | admitted / bound (median, max) | over-granted windows (sum, by client times) | over-granted windows (sum, exact) | Redis CPU µs/decision |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, n := range names {
		ss := r[kind][n]
		if len(ss) == 0 {
			continue
		}
		bound := func(s sample) float64 {
			return float64(s.ops) / (float64(bindingLimit.n)*s.elapsed.Seconds()/bindingLimit.per.Seconds() + float64(bindingLimit.burst))
		}
		over, exact := 0, 0
		for _, s := range ss {
			over += s.overGrant
			exact += s.overGrantExact
		}
		exactS := fmt.Sprint(exact)
		if ss[0].overGrantExact < 0 {
			exactS = "– (no server time)"
		}
		fmt.Printf("| %s | %s | %s | %.3f, %.3f | %d | %s | %.1f |\n", n,
			spread(each(ss, func(s sample) float64 { return float64(s.decisions) / s.elapsed.Seconds() }), "%.0f"),
			spread(each(ss, sample.rate), "%.0f"),
			median(each(ss, bound)), slices.Max(each(ss, bound)),
			over, exactS,
			median(each(ss, func(s sample) float64 { return float64(s.cpu.Microseconds()) / float64(max(s.decisions, 1)) })))
	}
}
