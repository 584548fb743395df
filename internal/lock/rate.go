package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
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
	if err := r.Check(); err != nil {
		return 0, time.Time{}, fmt.Errorf("lock: allow %q: %w", key, err)
	}
	b, ok := l.be.(*single)
	if !ok {
		return 0, time.Time{}, fmt.Errorf("lock: allow %q: %w (this one is %s)", key, errNoRate, l.kind)
	}
	v, err := run(ctx, b.client, scriptRate, []string{l.keysFor(key).rateKey()}, r.interval(), r.burst())
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("lock: allow %q: %w", key, err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 2 {
		return 0, time.Time{}, fmt.Errorf("lock: allow %q: unexpected reply %v", key, v)
	}
	us, _ := reply[0].(int64)
	now, _ := reply[1].(int64)
	return time.Duration(us) * time.Microsecond, time.UnixMicro(now), nil
}
