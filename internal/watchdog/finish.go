package watchdog

import (
	"cmp"
	"context"
	"errors"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// DefaultReleaseTimeout bounds the release in Finish.
const DefaultReleaseTimeout = 5_000_000_000 // 5s, as a time.Duration

// Finish ends a hold once its holder's work returned: it stops renewal,
// releases the lease (even when ctx has ended, bounded by the release
// timeout) and reports how the hold ended. It is the one end of a hold,
// used by the job server (also at shutdown) and by lockstep.WithLock alike;
// a repeated Finish releases nothing more.
//
// lost is the loss, if the lease was lost at any point: found by the
// watchdog while the work ran, or by the release itself (the key was gone or
// held another token when the work returned, before a renewal or notice
// could tell). A loss found at release is counted in
// lockstep_lock_lost_total{reason} and logged here. err is a release that
// failed for another reason (the lock then expires within its TTL).
//
// What the caller does with a loss is the outcome rule (docs/design.md G8): work
// that returned nil is done whatever lost says; only work that failed is
// retried.
func (h *Hold) Finish(ctx context.Context, opts ...FinishOption) (lost *lock.LostError, err error) {
	h.Stop()
	h.w.mu.Lock()
	if h.unreturned { // the work returned after its cancel
		h.unreturned = false
		h.w.metrics.HandlersUnreturned.Dec()
	}
	h.w.mu.Unlock()
	var c finishConfig
	for _, o := range opts {
		o(&c)
	}
	release := h.lease.Release
	if c.release != nil {
		release = c.release
	}
	timeout := cmp.Or(h.w.opts.ReleaseTimeout, DefaultReleaseTimeout)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	relErr := release(rctx)
	if h.counted.Load() {
		// The watchdog counted and logged it; a release that also failed
		// for transport reasons adds nothing the caller can act on.
		return h.lease.Lost(), nil
	}
	var atRelease *lock.LostError
	if errors.As(relErr, &atRelease) {
		if !h.counted.CompareAndSwap(false, true) {
			return h.lease.Lost(), nil // the watchdog found it meanwhile, and counted it
		}
		h.w.metrics.LockLost.WithLabelValues(string(atRelease.Reason)).Inc()
		h.logger().Warn("lock found lost at release: the work may have overlapped the next holder's",
			"key", h.lease.Key(), "reason", string(atRelease.Reason), "fence", h.lease.Fence())
		return atRelease, nil
	}
	return nil, relErr
}

// FinishOption tunes one Finish.
type FinishOption func(*finishConfig)

type finishConfig struct {
	release func(context.Context) error
}

// ReleaseWith has Finish release the lease with fn instead of
// Lease.Release: a release that also hands the lock to the next waiter (the
// job server's Locker.HandOn), which ends the lease as Release does.
func ReleaseWith(fn func(context.Context) error) FinishOption {
	return func(c *finishConfig) { c.release = fn }
}
