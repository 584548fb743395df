package lock

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fair waiting (the single back end). An Acquire that finds the lock busy
// joins the resource's queue (a zset by arrival time, in the lock's hash tag)
// under a waiter id of its own, and blocks on its wake list (BLPOP). The
// release pushes to the first live waiter's list, so that waiter wakes at
// once and takes the lock; while the queue has waiters, the lock is free only
// for its first one (TryAcquire included), so waiters are served in arrival
// order. The backoff delay bounds each blocking wait: a lost wake-up costs at
// most one delay, after which the waiter tries again (and keeps its place).
//
// A waiter keeps a key of its own alive for the lock's TTL with every
// attempt (each wait is at most half the TTL); a crashed waiter's key
// expires, and the next release or attempt drops it from the queue, so it
// holds the queue up for at most about one TTL. A waiter whose Acquire ends
// without the lock leaves the queue (leave.lua).

// fairWaiter is implemented by back ends whose Acquire waits in a queue
// that releases wake.
type fairWaiter interface {
	// waitTurn blocks until s's waiter is woken, d passes or ctx ends.
	waitTurn(ctx context.Context, s *Lease, d time.Duration)
	// leave takes s's waiter out of the queue, waking the next one when the
	// lock is free.
	leave(ctx context.Context, s *Lease)
}

func (b *single) waitTurn(ctx context.Context, s *Lease, d time.Duration) {
	d = min(d, b.maxBlock, s.ttl/2)
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	select {
	case b.waits <- struct{}{}:
	default: // every blocking slot taken: plain backoff
		sleep(ctx, d)
		return
	}
	done := make(chan struct{})
	go func() {
		defer func() { <-b.waits; close(done) }()
		// BLPOP takes seconds, fractions allowed (Redis ≥ 6).
		cmd := redis.NewStringSliceCmd(ctx, "blpop", s.keys.queue+":"+s.waiter+":wake",
			strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
		_ = b.client.Process(ctx, cmd)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (b *single) leave(ctx context.Context, s *Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = run(ctx, b.client, scriptLeave, []string{s.keys.lock, s.keys.queue}, s.waiter)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
