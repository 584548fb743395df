package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// slowFallback makes any wake-up that is not a release's show: a waiter that
// missed its wake-up sleeps 5s (or half its lock's TTL) before trying again.
var slowFallback = lock.WithWaitBackoff(backoff.Jitter{Min: 5 * time.Second, Max: 5 * time.Second})

// queued returns how many waiters resource's queue holds (see acquire.lua).
func queued(c *redis.Client, l *lock.Locker, resource string) int64 {
	return c.ZCard(context.Background(), l.Key(resource)+":queue").Val()
}

func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	m := metrics.New(nil)
	l, _, holder := newHeld(t, "r", time.Minute, lock.WithMetrics(m))
	ctx := context.Background()
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "r", time.Minute, lock.MaxWait(10*time.Second),
			lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: 20 * time.Millisecond}))
		if err == nil && lease.Fence() <= holder.Fence() {
			err = fmt.Errorf("fence %d not above holder's %d", lease.Fence(), holder.Fence())
		}
		got <- err
	}()
	eventually(t, 5*time.Second, "a busy attempt", func() bool {
		return testutil.ToFloat64(m.LockAcquire.WithLabelValues(metrics.AcquireBusy)) > 0
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
}

func TestAcquireGivesUpAtMaxWaitWithBoundedAttempts(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	ctx := context.Background()
	if _, err := l.TryAcquire(ctx, "r", time.Minute); err != nil {
		t.Fatal(err)
	}
	var attempts int
	start := time.Now()
	_, err := l.Acquire(ctx, "r", time.Minute, lock.MaxWait(time.Second),
		lock.CountAttempts(&attempts), lock.WithWaitBackoff(backoff.Jitter{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}))
	elapsed := time.Since(start)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Acquire on a held lock: %v, want ErrNotAcquired", err)
	}
	if elapsed < time.Second || elapsed > 3*time.Second {
		t.Fatalf("gave up after %v, want about the 1s max wait", elapsed)
	}
	// A fixed 10ms retry would make ~100 attempts; growing backoff makes far fewer.
	if attempts < 3 || attempts > 40 {
		t.Fatalf("%d attempts in 1s with 10ms..200ms backoff, want between 3 and 40", attempts)
	}
}

func TestAcquireHonoursContext(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	if _, err := l.TryAcquire(context.Background(), "r", time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := l.Acquire(ctx, "r", time.Minute)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Acquire with a cancelled context: %v, want context.Canceled and ErrNotAcquired", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Acquire returned %v after cancel", d)
	}
}

// TestWaitersAreServedInArrivalOrderOnRelease queues five waiters one after
// the other behind a holder and checks that each release hands the lock to
// the next in arrival order, at once (the fallback would take seconds).
func TestWaitersAreServedInArrivalOrderOnRelease(t *testing.T) {
	t.Parallel()
	l, c, holder := newHeld(t, "fifo", 10*time.Second)
	ctx := context.Background()
	const waiters = 5
	order := make(chan int, waiters)
	errs := make(chan error, waiters)     // Acquire failures
	released := make(chan error, waiters) // each waiter's Release
	for i := range waiters {
		go func() {
			lease, err := l.Acquire(ctx, "fifo", 10*time.Second, slowFallback, lock.MaxWait(20*time.Second))
			if err != nil {
				errs <- err
				return
			}
			order <- i
			time.Sleep(time.Millisecond) // a short hold
			released <- lease.Release(ctx)
		}()
		eventually(t, 5*time.Second, fmt.Sprintf("waiter %d in the queue", i), func() bool {
			return queued(c, l, "fifo") == int64(i+1)
		})
	}
	start := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for want := range waiters {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("served waiter %d, want %d (arrival order)", got, want)
			}
		case err := <-errs:
			t.Fatalf("waiter: %v", err)
		case <-time.After(4 * time.Second):
			t.Fatalf("waiter %d not served within 4s of the release: not woken by it", want)
		}
	}
	for range waiters {
		if err := <-released; err != nil {
			t.Fatal(err)
		}
	}
	// Woken by each release, five hand-offs take milliseconds; waiters that
	// missed their wake-ups would each sleep up to 1.5s (half the client's
	// read timeout bounds a blocking wait).
	if d := time.Since(start); d > time.Second {
		t.Fatalf("five hand-offs took %v: the waiters were not woken by the releases", d)
	}
	if n := queued(c, l, "fifo"); n != 0 {
		t.Fatalf("queue holds %d waiters after all were served", n)
	}
}

// TestTryAcquireDoesNotJumpTheQueue: while a waiter is queued, a released
// lock is the waiter's; a TryAcquire in between finds it busy.
func TestTryAcquireDoesNotJumpTheQueue(t *testing.T) {
	t.Parallel()
	l, c, holder := newHeld(t, "queue-first", 10*time.Second)
	ctx := context.Background()
	got := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		lease, err := l.Acquire(ctx, "queue-first", 10*time.Second, slowFallback, lock.MaxWait(20*time.Second))
		if err == nil {
			<-done // held until the test's TryAcquire was answered
			err = lease.Release(ctx)
		}
		got <- err
	}()
	eventually(t, 5*time.Second, "the waiter in the queue", func() bool { return queued(c, l, "queue-first") == 1 })
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "queue-first", 10*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire right after the release, with a waiter queued: %v, want ErrNotAcquired", err)
	}
	close(done)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestWaiterWhoseContextEndsLeavesTheQueue cancels the first of two waiters:
// it leaves the queue at once, and the release goes to the second.
func TestWaiterWhoseContextEndsLeavesTheQueue(t *testing.T) {
	t.Parallel()
	l, c, holder := newHeld(t, "leave", 10*time.Second)
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		_, err := l.Acquire(cctx, "leave", 10*time.Second, slowFallback)
		first <- err
	}()
	eventually(t, 5*time.Second, "the first waiter in the queue", func() bool { return queued(c, l, "leave") == 1 })
	second := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "leave", 10*time.Second, slowFallback, lock.MaxWait(20*time.Second))
		if err == nil {
			err = lease.Release(ctx)
		}
		second <- err
	}()
	eventually(t, 5*time.Second, "the second waiter in the queue", func() bool { return queued(c, l, "leave") == 2 })
	cancel()
	if err := redistest.Receive(t, first, time.Second, "the cancelled waiter to return"); !errors.Is(err, context.Canceled) || !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if n := queued(c, l, "leave"); n != 1 {
		t.Fatalf("queue holds %d waiters after the first left, want 1", n)
	}
	start := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := redistest.Receive(t, second, 4*time.Second, "the release to reach the second waiter (did the cancelled one still stand first?)"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("second waiter served %v after the release", d)
	}
	keys, _ := c.Keys(ctx, l.Key("leave")+":queue*").Result()
	if len(keys) != 0 {
		t.Fatalf("queue keys left after every waiter finished: %v", keys)
	}
}

// TestLeaveReleasesAHandOffBehindTheCancelMarker: a waiter whose context
// ended pushed its cancel marker to its wake list and is still queued when a
// release hands it the lock; leaving must find that hand-off behind the
// marker and release it, not delete it with the list (the lock would then
// stay with a waiter that is gone, for its TTL).
func TestLeaveReleasesAHandOffBehindTheCancelMarker(t *testing.T) {
	t.Parallel()
	l, c, holder := newHeld(t, "marker", 10*time.Second)
	ctx := context.Background()
	q := l.Key("marker") + ":queue"
	addDeadWaiter(t, c, q, "w", 10*time.Second)
	if err := c.RPush(ctx, q+":w:wake", "cancelled").Err(); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, l.Key("marker")).Val(); v != "w-token" {
		t.Fatalf("after the release the lock holds %q, want the waiter's token", v)
	}
	lock.Leave(l, "marker", "w")
	if n := c.Exists(ctx, l.Key("marker"), q+":w:wake", q+":w", q).Val(); n != 0 {
		keys, _ := c.Keys(ctx, l.Key("marker")+"*").Result()
		t.Fatalf("after the waiter left, keys remain: %v (the hand-off behind the marker was not released)", keys)
	}
}

// TestCrashedWaiterHoldsTheQueueUpAtMostItsTTL puts a waiter at the head of
// the queue that will never come back (what a killed process leaves: its
// entry and its hash with its token, alive for its TTL). The release hands
// the lock to it, as to any waiter; the lock then expires after that TTL and
// the next waiter gets it, within the TTL and one fallback wait.
func TestCrashedWaiterHoldsTheQueueUpAtMostItsTTL(t *testing.T) {
	t.Parallel()
	const ttl = 400 * time.Millisecond
	l, c, holder := newHeld(t, "crash", ttl)
	ctx := context.Background()
	q := l.Key("crash") + ":queue"
	addDeadWaiter(t, c, q, "dead", ttl)
	addDeadWaiter(t, c, q, "long-dead", 0) // its hash already expired: skipped
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "crash", ttl, lock.WithWaitBackoff(backoff.Jitter{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}),
			lock.MaxWait(10*time.Second))
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	eventually(t, 5*time.Second, "the live waiter behind the dead ones", func() bool { return queued(c, l, "crash") == 3 })
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, l.Key("crash")).Val(); v != "dead-token" {
		t.Fatalf("after the release the lock holds %q, want the first waiter's token", v)
	}
	if err := redistest.Receive(t, got, 5*time.Second, "the live waiter behind a crashed one at the head"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(released); d > ttl+time.Second {
		t.Fatalf("the live waiter got the lock %v after the release, want within the TTL %v and one fallback wait", d, ttl)
	}
}

// addDeadWaiter queues waiter id as a crashed process leaves it (the layout
// of acquire.lua's header), its hash alive for ttl (0: already expired).
func addDeadWaiter(t *testing.T, c *redis.Client, q, id string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	n, _ := c.ZCard(ctx, q).Result()
	if err := c.ZAdd(ctx, q, redis.Z{Score: float64(n + 1), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	if ttl > 0 {
		if err := c.HSet(ctx, q+":"+id, "token", id+"-token", "ttl", ttl.Milliseconds(), "owner", "").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpire(ctx, q+":"+id, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandedOffLeaseNeverOutlivesItsKey: a lease handed over by a release
// starts its validity no later than the hand-off, so its local deadline
// (AcquiredAt + TTL) never passes the key's real expiry, and not much before.
func TestHandedOffLeaseNeverOutlivesItsKey(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	for i := range 3 {
		holder := mustAcquire(t, ctx, l, "validity", ttl)
		got := make(chan *lock.Lease, 1)
		go func() {
			lease, err := l.Acquire(ctx, "validity", ttl, slowFallback, lock.MaxWait(20*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		eventually(t, 5*time.Second, "the waiter in the queue", func() bool { return queued(c, l, "validity") == 1 })
		time.Sleep(time.Duration(i) * 100 * time.Millisecond) // the waiter blocks a while before the hand-off
		before := time.Now()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := <-got
		if lease == nil {
			t.FailNow()
		}
		after := time.Now()
		pttl := c.PTTL(ctx, lease.RedisKey()).Val()
		expiry := time.Now().Add(pttl) // the key's expiry, to the millisecond
		deadline := lease.AcquiredAt().Add(ttl)
		if deadline.After(expiry.Add(time.Millisecond)) {
			t.Fatalf("hand-off %d: local deadline %v after the key's expiry %v", i, deadline, expiry)
		}
		if lease.AcquiredAt().Before(before.Add(-50*time.Millisecond)) || lease.AcquiredAt().After(after) {
			t.Fatalf("hand-off %d: AcquiredAt %v, want within the release [%v, %v]", i, lease.AcquiredAt(), before, after)
		}
		if got := c.Get(ctx, lease.RedisKey()).Val(); got != lease.Token() {
			t.Fatalf("hand-off %d: key holds %q, want the lease's token", i, got)
		}
		if lease.Fence() <= holder.Fence() {
			t.Fatalf("hand-off %d: fence %d <= the releasing holder's %d", i, lease.Fence(), holder.Fence())
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
