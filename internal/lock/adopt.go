package lock

import (
	"errors"
	"time"
)

// Adopt returns the lease for a lock that a caller's own script took on
// resource (in this Locker's key layout, with this Locker's fence rule): the
// job server's acquire and its hand-off to the next waiter (internal/jobs).
// The lease renews and releases like one from TryAcquire. Only the single
// back end can adopt: Redlock's lock lives on a quorum and etcd's in etcd,
// not in one script's keys.
func (l *Locker) Adopt(resource, token string, fence int64, ttl time.Duration, sent time.Time) (*Lease, error) {
	if _, ok := l.be.(*single); !ok {
		return nil, errors.New("lock: only a lease of the single back end can be adopted")
	}
	return &Lease{locker: l, keys: l.keysFor(resource), resource: resource,
		token: token, fence: fence, ttl: ttl, sent: sent}, nil
}

// MarkReleased records that a caller's own script released the lease (e.g.
// a release that also handed the lock on): later Renew calls return at once
// and Release returns nil without calling Redis.
func (s *Lease) MarkReleased() { s.state.set(errReleased) }

// FenceTTL is the fencing counter's TTL for callers' scripts that take locks
// in its layout (the jobs hand-off) without the lease's ttl at hand:
// DefaultTTL plus the fence TTL (WithFenceTTL). It outlives such a lock
// until the lease's first renewal (at ttl/3), which gives the counter ttl +
// the fence TTL, for any ttl up to three times that.
// Zero for back ends that keep no counter in Redis.
func (l *Locker) FenceTTL() time.Duration {
	if b, ok := l.be.(*single); ok {
		return DefaultTTL + b.fenceTTL
	}
	return 0
}
