package lock

import (
	"math/rand/v2"
	"time"
)

// Backoff is decorrelated-jitter backoff between Min and Max: each delay is
// drawn uniformly from [Min, 3 × previous delay], capped at Max. Retries spread
// out instead of arriving in waves, and the delay grows while contention lasts.
type Backoff struct {
	Min, Max time.Duration
}

// DefaultBackoff waits 10ms to 500ms between attempts.
var DefaultBackoff = Backoff{Min: 10 * time.Millisecond, Max: 500 * time.Millisecond}

// Next returns the delay after prev (0 for the first).
func (b Backoff) Next(prev time.Duration) time.Duration {
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

// Nth returns a delay for the n-th consecutive retry (n ≥ 1) when no previous
// delay is at hand, e.g. for a job requeued n times: it is drawn from
// [Min, Min × 3^n], capped at Max.
func (b Backoff) Nth(n int) time.Duration {
	prev := max(b.Min, time.Millisecond)
	for i := 1; i < n && prev < b.Max; i++ {
		prev *= 3
	}
	return b.Next(prev)
}
