package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Rate is a rate limit per key: at most N admissions per Per, of which
// Burst may come at once (0: N). Over any window w a key admits at most
// N·w/Per + Burst.
type Rate struct {
	N     int
	Per   time.Duration
	Burst int
}

// Check reports whether r is a rate limit: N ≥ 1, Per > 0, Burst ≥ 0.
func (r Rate) Check() error {
	switch {
	case r.N < 1:
		return fmt.Errorf("rate limit N=%d: N must be at least 1", r.N)
	case r.Per <= 0:
		return fmt.Errorf("rate limit Per=%v: Per must be positive", r.Per)
	case r.Burst < 0:
		return fmt.Errorf("rate limit Burst=%d: Burst must not be negative (0 is N)", r.Burst)
	}
	return nil
}

// interval is the emission interval Per/N in whole microseconds, rounded
// up: a rounding may cost a key a microsecond per admission, never admit
// one too many.
func (r Rate) interval() int64 {
	us := (r.Per.Nanoseconds() + int64(r.N) - 1) / int64(r.N)
	return max((us+999)/1000, 1)
}

// Interval is the emission interval: the time between two admissions at the
// rate, once its burst is spent.
func (r Rate) Interval() time.Duration { return time.Duration(r.interval()) * time.Microsecond }

func (r Rate) burst() int {
	if r.Burst == 0 {
		return r.N
	}
	return r.Burst
}

// errNoRate is Allow's error on the back ends without rate limits.
var errNoRate = errors.New("rate limits need the single Redis back end (one server, Sentinel or Cluster)")

// Allow admits one event under the rate limit r on key, on the server's
// clock (GCRA, lua/rate.lua): 0 means admitted now and counted; a positive
// wait means not admitted, nothing counted, and an admission tried that
// much later would be (unless another takes that turn first). The key's
// state lives at prefix{key}:rate, in key's hash tag, and expires on its
// own once idle. Only the single back end has rate limits: Redlock and
// etcd return an error.
func (l *Locker) Allow(ctx context.Context, key string, r Rate) (time.Duration, error) {
	wait, _, err := l.AllowAt(ctx, key, r)
	return wait, err
}

// AllowAt is Allow, with the server's time of the decision: with wait 0,
// the admission's time on the clock the limit is kept by.
func (l *Locker) AllowAt(ctx context.Context, key string, r Rate) (wait time.Duration, at time.Time, err error) {
	return l.rate(ctx, "allow", key, r, "", 0)
}

// Reserve is AllowAt for a task that can come back later: over the rate it
// takes the task's turn (counted now) and returns the wait until it, and
// when the task asks again on that turn, up to late after it, it is
// admitted without asking the limit again (lua/rate.lua with the turn's
// key). A task therefore waits once. at is the admission's time on the
// limit's schedule: now, or the turn. task names the task among those of
// key (a queue and its id); a turn not used expires shortly after late.
func (l *Locker) Reserve(ctx context.Context, key string, r Rate, task string, late time.Duration) (wait time.Duration, at time.Time, err error) {
	return l.rate(ctx, "reserve", key, r, task, late)
}

// WaitAllow admits one event under r on key, waiting for it where Allow
// would say how long: over the rate the call takes the next turn at once
// (counted, lua/rate.lua) and returns at it, so that callers of every
// process are admitted in the order their calls reached the server, one
// script call each, none polling. at is the admission's time on the
// server's clock (its turn). A caller whose ctx ends before its turn
// returns ctx's error and leaves the turn counted and unused: the limit is
// never exceeded, one admission of it is lost.
func (l *Locker) WaitAllow(ctx context.Context, key string, r Rate) (at time.Time, err error) {
	wait, at, err := l.rate(ctx, "wait", key, r, "", 0)
	if err != nil || wait == 0 {
		return at, err
	}
	t := time.NewTimer(wait) // from the reply, which came after the server's decision: not before the turn
	defer t.Stop()
	select {
	case <-t.C:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("lock: wait %q: its turn at %v was not waited for: %w", key, at.Format(time.RFC3339Nano), context.Cause(ctx))
	}
}

// rate runs lua/rate.lua for key under r, op "allow", "reserve" (with task)
// or "wait"; on one server, concurrent admissions share a call (batch.go).
func (l *Locker) rate(ctx context.Context, op, key string, r Rate, task string, late time.Duration) (time.Duration, time.Time, error) {
	if err := r.Check(); err != nil {
		return 0, time.Time{}, fmt.Errorf("lock: %s %q: %w", op, key, err)
	}
	b, ok := l.be.(*single)
	if !ok {
		return 0, time.Time{}, fmt.Errorf("lock: %s %q: %w (this one is %s)", op, key, errNoRate, l.kind)
	}
	k := l.keysFor(key)
	keys, args := []string{k.rateKey()}, []any{r.interval(), r.burst(), int64(0), op}
	if task != "" {
		keys, args[2] = append(keys, k.turnKey(task)), max(late.Microseconds(), 0)
	}
	v, err := b.call(ctx, b.rates, scriptRate, keys, args)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("lock: %s %q: %w", op, key, err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 3 {
		return 0, time.Time{}, fmt.Errorf("lock: %s %q: unexpected reply %v", op, key, v)
	}
	us, _ := reply[0].(int64)
	at, _ := reply[1].(int64)
	return time.Duration(us) * time.Microsecond, time.UnixMicro(at), nil
}

// RateState is a rate key's state, read from what lua/rate.lua keeps (the
// theoretical arrival time and the limit it was counted under) against the
// server's clock. Only a key whose state still matters exists: an idle key
// (its burst full) has expired.
type RateState struct {
	Key       string        // the key given to Allow
	Interval  time.Duration // the emission interval Per/N of its last admission's limit
	Burst     int           // that limit's burst
	BurstLeft int           // admissions it would allow at once now (0 to Burst)
	Next      time.Time     // the server's time from which it allows one: Now when BurstLeft > 0
	Now       time.Time     // the server's clock at the read
}

// state computes a key's state at now from its stored value "<TAT> <T>
// <B>" (µs, µs, count); ok is false for another value. With tat ahead of
// now by d, the admissions used up are ⌈d/T⌉ of B, and the next one comes
// when the TAT is within B−1 intervals: at TAT − (B−1)·T.
func rateState(key, val string, now time.Time) (RateState, bool) {
	f := strings.Fields(val)
	if len(f) != 3 {
		return RateState{}, false
	}
	tat, err1 := strconv.ParseInt(f[0], 10, 64)
	t, err2 := strconv.ParseInt(f[1], 10, 64)
	b, err3 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || err3 != nil || t < 1 || b < 1 {
		return RateState{}, false
	}
	s := RateState{Key: key, Interval: time.Duration(t) * time.Microsecond, Burst: b, BurstLeft: b, Next: now, Now: now}
	if d := tat - now.UnixMicro(); d > 0 {
		s.BurstLeft = max(b-int((d+t-1)/t), 0)
		if s.BurstLeft == 0 {
			s.Next = time.UnixMicro(tat - int64(b-1)*t)
		}
	}
	return s, true
}

// Rates returns the state of every live rate key under the Locker's prefix
// (Allow's), in no order; read only, each node's keys against its own clock
// (every master of a Cluster). Only the single back end has rate limits.
func (l *Locker) Rates(ctx context.Context) ([]RateState, error) {
	b, ok := l.be.(*single)
	if !ok {
		return nil, fmt.Errorf("lock: rates: %w (this one is %s)", errNoRate, l.kind)
	}
	var mu sync.Mutex
	var out []RateState
	each := func(ctx context.Context, n redis.Cmdable) error {
		var names []string
		iter := n.Scan(ctx, 0, l.RatePattern(), scanBatch).Iterator()
		for iter.Next(ctx) {
			names = append(names, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		for len(names) > 0 {
			batch := names[:min(len(names), scanBatch)]
			names = names[len(batch):]
			hs, err := readRates(ctx, l, n, batch)
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, hs...)
			mu.Unlock()
		}
		return nil
	}
	err := onEveryMaster(ctx, b.client, each)
	return out, err
}

// readRates reads the rate keys names on node in one pipeline, with the
// node's clock (TIME) in the same round trip. A key gone since the scan, or
// not a rate key's value, is left out.
func readRates(ctx context.Context, l *Locker, node redis.Cmdable, names []string) ([]RateState, error) {
	var now *redis.TimeCmd
	vals := make([]*redis.StringCmd, len(names))
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for i, k := range names {
			vals[i] = p.Get(ctx, k)
		}
		return nil
	})
	t, err := now.Result()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	var out []RateState
	for i, c := range vals {
		key, ok := l.rateOf(names[i])
		if !ok || c.Err() != nil {
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !strings.HasPrefix(err.Error(), "WRONGTYPE") {
				return nil, fmt.Errorf("redis: %w", err)
			}
			continue
		}
		if s, ok := rateState(key, c.Val(), t); ok {
			out = append(out, s)
		}
	}
	return out, nil
}
