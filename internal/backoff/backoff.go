// Package backoff is Lockstep's one retry delay: decorrelated jitter between
// a minimum and a maximum, the defaults for each kind of wait, and the one
// context-aware wait (Sleep).
//
// Every wait in Lockstep that retries (a caller waiting for a busy lock, a
// job requeued because its lock was busy or lost, the scheduler retrying a
// Redis call, a lost tracking connection or etcd watch restarted) draws its
// delays from a Jitter. Only the bounds differ, because what one attempt
// costs differs; see the defaults below.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter is decorrelated-jitter backoff between Min and Max: each delay is
// drawn uniformly from [Min, 3 × previous delay], capped at Max. Retries
// spread out instead of arriving in waves, and the delay grows while the
// cause lasts. A Min of 0 or less counts as 1ms; a Max below Min as Min.
type Jitter struct {
	Min, Max time.Duration
}

// The defaults, one per kind of wait. Their bounds differ on purpose:
var (
	// LockWait spaces the attempts of a caller that waits in its own process
	// for a busy lock (lock.Acquire with a max wait, lockstep's WithLock with
	// Wait). An attempt is one cheap Redis call, and on one Redis deployment
	// a release hands the lock to the first waiter directly, so the backoff
	// is only the fallback for a lost hand-off: short, 10ms to 500ms.
	LockWait = Jitter{Min: 10 * time.Millisecond, Max: 500 * time.Millisecond}

	// Requeue is the delay before a job whose lock was busy (or lost) is
	// offered again (worker.contention_backoff_min/_max). An attempt costs a
	// queue round trip and a worker slot, and a hot resource may stay busy
	// for a handler's whole run, so it starts higher and may grow to 10s; a
	// release wakes the next waiter sooner anyway.
	Requeue = Jitter{Min: 100 * time.Millisecond, Max: 10 * time.Second}

	// RedisRetry spaces the scheduler's retries of one failed Redis call
	// (a restart, a failover): soon enough to claim a tick within its
	// second, capped at 500ms so a recovered Redis is used at once. The etcd
	// back end's release retries a call that etcd could not answer (a
	// leader change) with it too.
	RedisRetry = Jitter{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}

	// Reconnect spaces the attempts to restore a long-lived stream from a
	// store that went away: the watchdog's tracking connection to Redis, the
	// etcd back end's watch. Nothing waits on one attempt (renewals stay the
	// authority), so it starts at 50ms and is capped at 2s: a store that
	// stays down costs an attempt every second or two.
	Reconnect = Jitter{Min: 50 * time.Millisecond, Max: 2 * time.Second}
)

// Next returns the delay after prev (0 for the first).
func (b Jitter) Next(prev time.Duration) time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	upper := 3 * max(prev, lo)
	if upper > hi {
		upper = hi
	}
	if upper <= lo {
		return lo
	}
	return lo + rand.N(upper-lo+1)
}

// Sleep waits d, or less when ctx ends first; it reports whether the whole
// d passed. It is the one context-aware wait between retries.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Nth returns a delay for the n-th consecutive retry (n ≥ 1) when no previous
// delay is at hand, e.g. for a job requeued n times: it is drawn from
// [Min, Min × 3^n], capped at Max.
func (b Jitter) Nth(n int) time.Duration {
	prev := max(b.Min, time.Millisecond)
	for i := 1; i < n && prev < b.Max; i++ {
		prev *= 3
	}
	return b.Next(prev)
}
