package lockstep

import (
	"context"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// RateLimit is a rate limit per key: at most N admissions per Per, of which
// Burst may come at once (0: N). Over any window w a key admits at most
// N·w/Per + Burst, across every process that shares the Redis (G11 in the
// README's guarantees). N must be at least 1, Per positive.
type RateLimit struct {
	N     int
	Per   time.Duration
	Burst int
}

// Allow admits one event on key under the rate limit r: it returns 0 when
// the event is admitted now (and counted), or the wait before one would be
// (nothing counted): an Allow tried that much later succeeds, unless another
// caller takes that turn first. The limit is GCRA on the Redis server's
// clock, in one script on key's own hash tag (one server, Sentinel or
// Cluster), and its state expires on its own once idle. Lockers of NewRedlock
// and of package etcd return an error.
func (l *Locker) Allow(ctx context.Context, key string, r RateLimit) (time.Duration, error) {
	return l.locker.Allow(ctx, key, lock.Rate(r))
}

// WaitAllow is Allow that waits: over the rate it takes the next turn at
// once (counted) and returns when that turn comes, so callers of every
// process are admitted in the order their calls reached Redis, with one
// round trip each and no polling. It returns nil once admitted, or ctx's
// error if ctx ends first; a turn given up so stays counted and unused (the
// limit is never exceeded, one admission of it is lost).
func (l *Locker) WaitAllow(ctx context.Context, key string, r RateLimit) error {
	_, err := l.locker.WaitAllow(ctx, key, lock.Rate(r))
	return err
}
