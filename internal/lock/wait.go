package lock

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
)

// Fair waiting (the single back end). An Acquire that finds the lock busy
// joins the resource's queue (a zset by arrival time, in the lock's hash tag)
// under a waiter id of its own, with the token it tried, and blocks on its
// wake list (BLPOP). The release hands the lock to the first live waiter
// directly (release.lua: the lock key is set to that waiter's token, with
// its fence) and pushes the hand-off to the waiter's list, which wakes it
// holding the lock: two round trips per contended acquisition. While the
// queue has waiters the lock is free only for the first of them, TryAcquire
// included, so waiters are served in arrival order. The backoff's longest
// delay bounds each blocking wait: after a lost wake-up (a holder that
// crashed instead of releasing) the waiter tries again and keeps its place,
// and an attempt that finds the lock free hands it on the same way.
//
// A waiter keeps its hash alive for the lock's TTL with every attempt (each
// wait is at most half the TTL); a crashed waiter's hash expires and the
// next hand-off skips it, and one that was handed the lock just before it
// crashed holds it for its TTL, like any crashed holder. A waiter whose
// Acquire ends without the lock leaves the queue (leave.lua) and releases a
// hand-off that reached it meanwhile, which hands the lock on. The BLPOP
// runs on the Acquire's own goroutine; a context that ends during it pushes
// a marker to the waiter's wake list, which ends it at once.
//
// The lease's validity: a hand-off was made at the server time at, after the
// waiter's last busy attempt, answered with the server time then; so the
// hand-off happened at least at − busy-time after that attempt was sent, by
// the waiter's own clock. That lower bound is the lease's send time.

// waitState is one Acquire's place in the queue.
type waitState struct {
	id     string    // the waiter id
	sent   time.Time // when its last busy attempt was sent (zero: never queued)
	server int64     // the server's time in µs when that attempt ran
	rev    int64     // etcd: the revision its last busy attempt read (changeWaiter)
	place  etcdPlace // etcd: its place in the resource's queue (etcd_queue.go)
}

func (w *waitState) busy(sent time.Time, server int64) { w.sent, w.server = sent, server }

// handedAt is the earliest local time a hand-off at server time at (µs)
// can have happened: the lease's validity starts there.
func (w *waitState) handedAt(at int64) time.Time {
	if w.sent.IsZero() || at < w.server {
		return w.sent // no better bound; a hand-off follows a busy attempt
	}
	return w.sent.Add(time.Duration(at-w.server) * time.Microsecond)
}

// fairWaiter is implemented by back ends whose Acquire waits in a queue
// that releases hand the lock over from.
type fairWaiter interface {
	// fairWaiting reports whether this back end's Acquire waits in the queue
	// (not with WaitReplicas: a hand-off is not followed by WAIT).
	fairWaiting() bool
	// waitTurn blocks until a hand-off reaches s's waiter (then s holds the
	// lock and it reports true), d passes or ctx ends.
	waitTurn(ctx context.Context, s *Lease, d time.Duration) (bool, error)
	// leave takes s's waiter out of the queue, releasing a hand-off that
	// reached it meanwhile.
	leave(ctx context.Context, s *Lease)
}

// changeWaiter is implemented by back ends whose waiter holds a place in the
// store that its busy attempts make and read, and that a change in the store
// wakes (etcd: etcd_queue.go).
type changeWaiter interface {
	// waitChange blocks until the key w watches changes after w's last busy
	// attempt (the place just ahead of it, or the permits for the first),
	// d passes or ctx ends.
	waitChange(ctx context.Context, k keys, w *waitState, d time.Duration)
	// stopWaiting ends w's wait, when its Acquire ends: w leaves its place.
	stopWaiting(k keys, w *waitState)
}

func (b *single) fairWaiting() bool { return b.replicas == 0 }

func (b *single) waitTurn(ctx context.Context, s *Lease, d time.Duration) (bool, error) {
	d = min(d, b.maxBlock, s.ttl/2)
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	d = max(d, time.Millisecond)
	select {
	case b.waits <- struct{}{}:
	default: // every blocking slot taken: plain backoff, then try again
		backoff.Sleep(ctx, d)
		return false, nil
	}
	defer func() { <-b.waits }()
	// The BLPOP runs on the caller's goroutine (a hand-off wakes the Acquire
	// itself, nothing else runs in between) and is not cancelled with ctx: a
	// hand-off it pops must reach the lease or be released. When ctx ends
	// first, a marker pushed to the wake list ends it at once.
	wake := s.keys.waiterKey(s.wait.id) + ":wake"
	marked := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(marked)
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = b.client.Pipelined(mctx, func(p redis.Pipeliner) error {
			p.RPush(mctx, wake, wakeCancelled)
			p.PExpire(mctx, wake, s.ttl)
			return nil
		})
	})
	cmd := redis.NewStringSliceCmd(ctx, "blpop", wake, strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	_ = b.client.Process(context.WithoutCancel(ctx), cmd)
	vals, err := cmd.Result()
	if !stop() {
		// ctx ended: the marker is in the list (the Acquire's leave deletes
		// it) unless this BLPOP popped it; a hand-off popped before it is
		// passed on.
		<-marked
		if err == nil && len(vals) == 2 && vals[1] != wakeCancelled {
			b.releaseHandoff(context.WithoutCancel(ctx), s, vals[1])
		}
		return false, nil
	}
	switch {
	case errors.Is(err, redis.Nil): // timed out: try again
		return false, nil
	case err != nil:
		return false, err
	case len(vals) != 2:
		return false, nil
	}
	var g grant
	if !parseHandoff(&g, vals[1]) {
		return false, nil
	}
	s.token, s.fence, s.sent = g.token, g.fence, s.wait.handedAt(g.at)
	s.keys = s.keys.permitKeys(g.permit)
	return true, nil
}

// wakeCancelled is what a waiter whose context ended pushes to its own wake
// list to end its BLPOP (never a hand-off: parseHandoff rejects it).
const wakeCancelled = "cancelled"

func (b *single) leave(ctx context.Context, s *Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	v, err := run(ctx, b.client, scriptLeave, []string{s.keys.queue}, s.wait.id, wakeCancelled)
	if h, ok := v.(string); ok && err == nil {
		b.releaseHandoff(ctx, s, h)
	}
}

// releaseHandoff releases a lock handed to s's waiter after it gave up.
func (b *single) releaseHandoff(ctx context.Context, s *Lease, handoff string) {
	var g grant
	if parseHandoff(&g, handoff) {
		given := &Lease{keys: s.keys.permitKeys(g.permit), resource: s.resource, token: g.token, owner: s.owner, ttl: s.ttl}
		_ = b.release(ctx, given)
	}
}
