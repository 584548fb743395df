package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Permits (a limit N > 1): at most N holders of a resource, each on a permit
// of its own with its own fence, handed on in the order of the one queue.

func tryPermit(t *testing.T, l *lock.Locker, resource string, n int) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), resource, time.Minute, lock.Permits(n))
	if err != nil {
		t.Fatalf("TryAcquire %q limit %d: %v", resource, n, err)
	}
	return lease
}

func TestPermitsAtMostNEachWithItsOwnFence(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	var held [3]*lock.Lease
	for k := range held {
		held[k] = tryPermit(t, l, "p", 3)
		if held[k].Permit() != k {
			t.Fatalf("holder %d got permit %d, want the lowest free, %d", k, held[k].Permit(), k)
		}
	}
	if _, err := l.TryAcquire(ctx, "p", time.Minute, lock.Permits(3)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a fourth holder of limit 3: %v, want ErrNotAcquired", err)
	}
	// Permit 0 is the lock's own key; the others have keys of their own.
	if got := c.Get(ctx, l.Key("p")).Val(); got != held[0].Token() {
		t.Fatalf("permit 0 is not the lock key %s", l.Key("p"))
	}
	if got := c.Get(ctx, l.PermitKey("p", 2)).Val(); got != held[2].Token() {
		t.Fatalf("permit 2's key holds %q", got)
	}
	old := held[1].Fence()
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := tryPermit(t, l, "p", 3)
	if next.Permit() != 1 || next.Fence() <= old {
		t.Fatalf("after permit 1's release: permit %d fence %d, want permit 1 with a fence above %d",
			next.Permit(), next.Fence(), old)
	}
	for _, s := range []*lock.Lease{held[0], next, held[2]} {
		if err := s.Renew(ctx); err != nil {
			t.Fatalf("permit %d: renew: %v", s.Permit(), err)
		}
	}
	// A permit deleted or overwritten is lost like a lock, and only it.
	c.Del(ctx, l.PermitKey("p", 2))
	if err := held[2].Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("renew of a deleted permit: %v, want ErrLockLost", err)
	}
	c.Set(ctx, l.PermitKey("p", 1), "someone else", time.Minute)
	if err := next.Renew(ctx); !errors.Is(err, lock.ErrLockLost) || next.Lost().Reason != lock.ReasonStolen {
		t.Fatalf("renew of an overwritten permit: %v, want stolen", err)
	}
	if err := held[0].Renew(ctx); err != nil {
		t.Fatalf("permit 0 after the others' losses: %v", err)
	}
}

func TestBadLimitIsRefused(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	for _, n := range []int{0, -1} {
		if _, err := l.TryAcquire(context.Background(), "bad", time.Second, lock.Permits(n)); err == nil || !containsAll(err.Error(), "limit", "below 1") {
			t.Fatalf("limit %d: %v, want a clear refusal", n, err)
		}
		if _, err := l.Acquire(context.Background(), "bad", time.Second, lock.Permits(n)); err == nil || !containsAll(err.Error(), "below 1") {
			t.Fatalf("Acquire limit %d: %v", n, err)
		}
	}
}

// TestPermitsHandedOnInArrivalOrder: with every permit held, waiters queue in
// the one queue; each release hands its permit to the longest waiter.
func TestPermitsHandedOnInArrivalOrder(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	a, b := tryPermit(t, l, "q", 2), tryPermit(t, l, "q", 2)
	const waiters = 4
	type got struct {
		i     int
		lease *lock.Lease
	}
	served := make(chan got, waiters)
	errs := make(chan error, waiters)
	for i := range waiters {
		go func() {
			lease, err := l.Acquire(ctx, "q", 10*time.Second, slowFallback, lock.MaxWait(20*time.Second), lock.Permits(2))
			if err != nil {
				errs <- err
				return
			}
			served <- got{i, lease}
		}()
		eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return queued(c, l, "q") == int64(i+1) })
	}
	start := time.Now()
	prev := map[int]int64{0: a.Fence(), 1: b.Fence()}
	release := []*lock.Lease{b, a}
	for want := range waiters {
		r := release[0]
		release = release[1:]
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-served:
			if g.i != want {
				t.Fatalf("served waiter %d, want %d (arrival order)", g.i, want)
			}
			if g.lease.Permit() != r.Permit() || g.lease.Fence() <= prev[r.Permit()] {
				t.Fatalf("waiter %d: permit %d fence %d, want permit %d's hand-off with a fence above %d",
					g.i, g.lease.Permit(), g.lease.Fence(), r.Permit(), prev[r.Permit()])
			}
			prev[r.Permit()] = g.lease.Fence()
			if err := g.lease.Renew(ctx); err != nil {
				t.Fatalf("handed-off permit: %v", err)
			}
			release = append(release, g.lease)
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(4 * time.Second):
			t.Fatalf("waiter %d not served: not woken by the release", want)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("four hand-offs took %v: the waiters were not woken", d)
	}
}

// TestLoweredLimitAdmitsNoOneUntilBelowIt: the limit is the latest
// declarer's. Lowered from 3 to 2 while 3 hold, nobody loses a permit and
// nobody gets one until fewer than 2 are held.
func TestLoweredLimitAdmitsNoOneUntilBelowIt(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	checkLoweredLimit(t, l)
}

func checkLoweredLimit(t *testing.T, l *lock.Locker) {
	t.Helper()
	ctx := context.Background()
	held := []*lock.Lease{tryPermit(t, l, "low", 3), tryPermit(t, l, "low", 3), tryPermit(t, l, "low", 3)}
	busy := func(n int) {
		t.Helper()
		if s, err := l.TryAcquire(ctx, "low", time.Minute, lock.Permits(n)); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("limit %d with %d held: %v (permit %d), want busy", n, len(held), err, s.Permit())
		}
	}
	busy(2)
	if err := held[0].Release(ctx); err != nil { // 2 held: not below 2
		t.Fatal(err)
	}
	held = held[1:]
	busy(2)
	for _, s := range held {
		if err := s.Renew(ctx); err != nil {
			t.Fatalf("permit %d lost for a lowered limit: %v", s.Permit(), err)
		}
	}
	if err := held[0].Release(ctx); err != nil { // 1 held: below 2
		t.Fatal(err)
	}
	s := tryPermit(t, l, "low", 2)
	if s.Permit() != 0 {
		t.Fatalf("got permit %d, want the lowest free, 0", s.Permit())
	}
	// A lock (limit 1) on a limited resource also counts every holder.
	busy(1)
}

// TestDifferentLimitsTheLatestDeclarerWins: a caller that declares a larger
// limit raises the resource's; smaller declarers then wait until below theirs.
func TestDifferentLimitsTheLatestDeclarerWins(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	checkDifferentLimits(t, l)
}

func checkDifferentLimits(t *testing.T, l *lock.Locker) {
	t.Helper()
	ctx := context.Background()
	tryPermit(t, l, "mix", 2)
	tryPermit(t, l, "mix", 2)
	if s := tryPermit(t, l, "mix", 3); s.Permit() != 2 {
		t.Fatalf("limit 3 got permit %d, want 2", s.Permit())
	}
	if _, err := l.TryAcquire(ctx, "mix", time.Minute, lock.Permits(2)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("limit 2 with 3 held: %v", err)
	}
	// A plain lock of a resource whose permit 0 is free but others are held
	// waits too: it is a resource of limit 1 now.
	first := tryPermit(t, l, "one", 2)
	tryPermit(t, l, "one", 2)
	a, _ := l.TryAcquire(ctx, "one", time.Minute)
	if a != nil {
		t.Fatalf("a lock of a resource with 2 holders got permit %d", a.Permit())
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if a, _ := l.TryAcquire(ctx, "one", time.Minute); a != nil { // permit 0 is free, 1 is held
		t.Fatalf("a lock of a resource with a holder got permit %d", a.Permit())
	}
}

func TestPermitReentrancyEntersTheOwnersPermit(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	checkPermitReentrancy(t, l)
}

func checkPermitReentrancy(t *testing.T, l *lock.Locker) {
	t.Helper()
	ctx := lock.WithOwner(context.Background(), "job-1")
	tryPermit(t, l, "re", 3)
	outer, err := l.TryAcquire(ctx, "re", time.Minute, lock.Permits(3))
	if err != nil || outer.Permit() != 1 {
		t.Fatalf("outer: %v", err)
	}
	inner, err := l.TryAcquire(ctx, "re", time.Minute, lock.Permits(3))
	if err != nil || !inner.Reentrant() || inner.Permit() != 1 || inner.Fence() != outer.Fence() {
		t.Fatalf("inner: %v, want a re-entry of permit 1", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := outer.Renew(ctx); err != nil {
		t.Fatalf("outer after the inner release: %v", err)
	}
}

func TestCrashedPermitHolderFreesItsPermitWithinItsTTL(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	checkCrashedPermit(t, l, l, 300*time.Millisecond, 2*time.Second)
}

// checkCrashedPermit: permit 1, taken by crashed for ttl and never renewed
// nor released, is l's again within bound.
func checkCrashedPermit(t *testing.T, l, crashedLocker *lock.Locker, ttl, bound time.Duration) {
	t.Helper()
	ctx := context.Background()
	tryPermit(t, l, "crash", 2)
	crashed, err := crashedLocker.TryAcquire(ctx, "crash", ttl, lock.Permits(2))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lease, err := l.Acquire(ctx, "crash", time.Minute, lock.Permits(2), lock.MaxWait(5*time.Second),
		lock.WithWaitBackoff(backoff.Jitter{Min: 5 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > bound || lease.Permit() != crashed.Permit() || lease.Fence() <= crashed.Fence() {
		t.Fatalf("after %v: permit %d fence %d, want the crashed holder's permit %d above fence %d within its TTL",
			d, lease.Permit(), lease.Fence(), crashed.Permit(), crashed.Fence())
	}
}

// TestPermitsUnderContentionNeverOverlap: 16 goroutines cycle one resource of
// limit 4. At no instant do more than 4 hold it or two hold one permit, and
// every permit's fences strictly increase in the order its holders held it,
// as a store keeping the last fence per (resource, permit) sees them.
func TestPermitsUnderContentionNeverOverlap(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	contendPermits(t, []*lock.Locker{l})
}

// TestPermitsOnCluster: every permit of a resource lives in the slot of its
// {R}: acquires, hand-offs and renewals (one script per lease there) work
// as on one server.
func TestPermitsOnCluster(t *testing.T) {
	t.Parallel()
	l := lock.New(redistest.StartCluster(t, 3).Client(func(o *redis.ClusterOptions) { o.PoolSize = 64 }))
	ctx := context.Background()
	var held []*lock.Lease
	for _, r := range []string{"c1", "c2"} {
		for range 3 {
			held = append(held, tryPermit(t, l, r, 3))
		}
	}
	for i, err := range l.RenewAll(ctx, held) {
		if err != nil {
			t.Fatalf("renew of permit %d of %s: %v", held[i].Permit(), held[i].Key(), err)
		}
	}
	contendPermits(t, []*lock.Locker{l})
}

// contendPermits runs contenders on lockers, in turn; opts tune their waits.
func contendPermits(t *testing.T, lockers []*lock.Locker, opts ...lock.AcquireOption) {
	t.Helper()
	ctx := context.Background()
	const limit, workers, cycles = 4, 16, 30
	var holding atomic.Int32
	var mu sync.Mutex
	last := map[int]int64{}
	owner := map[int]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range cycles {
				l := lockers[w%len(lockers)]
				lease, err := l.Acquire(ctx, "busy", 10*time.Second, append([]lock.AcquireOption{lock.Permits(limit), lock.MaxWait(20 * time.Second)}, opts...)...)
				if err != nil {
					errs <- err
					return
				}
				if n := holding.Add(1); n > limit {
					errs <- fmt.Errorf("%d holders at once", n)
				}
				k := lease.Permit()
				mu.Lock()
				if o, ok := owner[k]; ok {
					errs <- fmt.Errorf("permit %d held by %d and %d at once", k, o, w)
				}
				if lease.Fence() <= last[k] {
					errs <- fmt.Errorf("permit %d: fence %d after %d (the store refuses it)", k, lease.Fence(), last[k])
				}
				owner[k], last[k] = w, lease.Fence()
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				delete(owner, k)
				mu.Unlock()
				holding.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(last) != limit {
		t.Fatalf("permits used: %v, want %d of them", last, limit)
	}
}

// TestTasksTakePermitsAndChainsHandThemOn: parked tasks take permits, wait
// in the one queue, and a job's release hands its permit to the task head
// (a chain) or grants it; the grant names the permit, and the task's take
// takes that permit over.
func TestTasksTakePermitsAndChainsHandThemOn(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	take := func(id string) lock.Taken {
		t.Helper()
		r, err := l.Take(ctx, "tasks", "default", id, time.Minute, time.Minute, true, "", 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := take("a"), take("b")
	if a.Lease == nil || b.Lease == nil || a.Lease.Permit() != 0 || b.Lease.Permit() != 1 {
		t.Fatalf("two tasks of limit 2: %+v %+v", a, b)
	}
	if r := take("c"); r.Lease != nil || r.Ahead != 0 || r.PTTL <= 0 {
		t.Fatalf("a third task: %+v, want busy at the head of the queue", r)
	}
	take("d")
	// b's release hands permit 1 to c, for the releasing worker to run.
	h, err := l.HandOn(ctx, b.Lease, lock.HandOff{Chain: true, Queue: "default", ID: "b", Outcome: "ok", MarkerTTL: time.Minute})
	if err != nil || h.Next == nil || h.Next.ID != "c" || h.Next.Permit != 1 || h.Next.Fence <= b.Lease.Fence() {
		t.Fatalf("hand-on: %+v %v, want c on permit 1 above fence %d", h.Next, err, b.Lease.Fence())
	}
	cl := l.Adopt(h.Next, time.Minute)
	if err := cl.Renew(ctx); err != nil || cl.Permit() != 1 {
		t.Fatalf("the chained permit: %v", err)
	}
	// The chain cannot run c: it grants permit 1 to c, whose take takes it over.
	if ok, err := l.Grant(ctx, h.Next); !ok || err != nil {
		t.Fatalf("grant: %v %v", ok, err)
	}
	if v := c.Get(ctx, l.PermitKey("tasks", 1)).Val(); !containsAll(v, "g:", `"c"`, "/1") {
		t.Fatalf("permit 1 holds %q, want c's grant naming permit 1", v)
	}
	r := take("c")
	if r.Lease == nil || !r.Granted || r.Lease.Permit() != 1 || r.Lease.Fence() != h.Next.Fence {
		t.Fatalf("c's take of its grant: %+v", r)
	}
	// a's plain release (no chain) grants permit 0 to d, heard on the grants channel.
	heard := make(chan lock.GrantNotice, 1)
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := l.Grants(gctx, func(n lock.GrantNotice) { heard <- n }); err != nil {
		t.Fatal(err)
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-heard:
		if n.ID != "d" || n.Permit != 1 {
			t.Fatalf("grant notice %+v, want d on permit 1", n)
		}
		// d is gone: its grant is passed on, and the permit is free.
		if err := l.Pass(ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no grant notice")
	}
	if v := c.Exists(ctx, l.PermitKey("tasks", 1)).Val(); v != 0 {
		t.Fatal("a passed grant still holds permit 1")
	}
	if held, err := l.HeldBy(ctx, "tasks", procid.Self()); err != nil || !held {
		t.Fatalf("HeldBy: %v %v, want a's permit 0 held by this process", held, err)
	}
}

// TestPermitKeysLiveWhileHeldAndGoAfterTheFenceTTL: renewals keep a permit's
// counter and its resource's limit (so a lock still counts every holder);
// once all are released, every key of the resource expires.
func TestPermitKeysLiveWhileHeldAndGoAfterTheFenceTTL(t *testing.T) {
	t.Parallel()
	const ttl, fenceTTL = 200 * time.Millisecond, 100 * time.Millisecond
	l, c, _ := newLocker(t, lock.WithFenceTTL(fenceTTL))
	ctx := context.Background()
	a, err := l.TryAcquire(ctx, "live", ttl, lock.Permits(2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, "live", ttl, lock.Permits(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil { // permit 1 alone is held
		t.Fatal(err)
	}
	for end := time.Now().Add(4 * (ttl + fenceTTL)); time.Now().Before(end); {
		time.Sleep(ttl / 4)
		if err := b.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c.Exists(ctx, l.PermitFenceKey("live", 1)).Val() != 1 {
		t.Fatal("permit 1's counter expired while it was renewed")
	}
	if s, err := l.TryAcquire(ctx, "live", ttl); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a lock with permit 1 held (the limit forgotten?): %v, permit %d", err, s.Permit())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "every key of the resource to expire", func() bool {
		return c.DBSize(ctx).Val() == 0
	})
}

func TestRedlockRefusesALimit(t *testing.T) {
	t.Parallel()
	r := newRedlockRig(t)
	if err := r.l.CheckLimit(2); err == nil || !containsAll(err.Error(), "limit of 2", "single Redis back end", "redlock") {
		t.Fatalf("CheckLimit(2) on Redlock: %v", err)
	}
	if _, err := r.l.TryAcquire(context.Background(), "x", time.Second, lock.Permits(2)); err == nil {
		t.Fatal("Redlock took a permit")
	}
	if err := r.l.CheckLimit(1); err != nil {
		t.Fatalf("a lock on Redlock: %v", err)
	}
}
