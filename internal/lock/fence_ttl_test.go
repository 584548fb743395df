package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// The fencing counter's lifetime (lock.fence_ttl): every acquire and renewal
// gives it the lock's ttl + the fence TTL, so it lives while its lock does
// and is gone the fence TTL after the lock's end.

// TestReleasedResourceKeysAreGoneAfterTheFenceTTL: after a reentrant hold,
// a waiter and a release, no key of the resource is left: the only key is
// its slot's fence floor, with the lock's ttl + the fence TTL to live; it is
// gone after that, and a fresh fence is still greater.
func TestReleasedResourceKeysAreGoneAfterTheFenceTTL(t *testing.T) {
	t.Parallel()
	const ttl, fenceTTL = 200 * time.Millisecond, 300 * time.Millisecond
	l, c, _ := newLocker(t, lock.WithFenceTTL(fenceTTL))
	ctx := lock.WithOwner(context.Background(), "owner-a")
	outer := mustAcquire(t, ctx, l, "gone", ttl)
	inner := mustAcquire(t, ctx, l, "gone", ttl) // the reentrancy hash
	// A waiter that gives up leaves its queue entry behind it until it leaves.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	if _, err := l.Acquire(wctx, "gone", ttl, lock.MaxWait(30*time.Millisecond)); err == nil {
		t.Fatal("a waiter got a held lock")
	}
	cancel()
	for _, s := range []*lock.Lease{inner, outer} {
		if err := s.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	released := time.Now()
	keys := c.Keys(context.Background(), "*").Val()
	if len(keys) != 1 || keys[0] != l.FenceFloorKey("gone") {
		t.Fatalf("keys after the release: %v, want only the slot's fence floor %s", keys, l.FenceFloorKey("gone"))
	}
	if floor, _ := c.Get(context.Background(), keys[0]).Int64(); floor != outer.Fence() {
		t.Fatalf("fence floor %d, want the released fence %d", floor, outer.Fence())
	}
	pttl := c.PTTL(context.Background(), keys[0]).Val()
	if pttl <= 0 || pttl > ttl+fenceTTL {
		t.Fatalf("fence floor PTTL %v, want within (0, %v]", pttl, ttl+fenceTTL)
	}
	eventually(t, pttl+time.Second, "the fence floor to expire", func() bool {
		return c.DBSize(context.Background()).Val() == 0
	})
	if late := time.Since(released); late < pttl-50*time.Millisecond {
		t.Fatalf("the floor was gone %v after the release, before its PTTL %v", late, pttl)
	}
	// A fresh counter starts at the server's clock: still a greater fence.
	next := mustAcquire(t, context.Background(), l, "gone", ttl)
	if next.Fence() <= outer.Fence() {
		t.Fatalf("fence after the counter expired: %d <= %d", next.Fence(), outer.Fence())
	}
}

// TestRenewalKeepsTheCounterWhileHeld: a hold renewed past its first ttl +
// fence TTL keeps its counter, renewed with the lock, on one server and on
// every Redlock node, and a re-entry then still gets the hold's fence (it
// reads the counter).
func TestRenewalKeepsTheCounterWhileHeld(t *testing.T) {
	t.Parallel()
	const ttl, fenceTTL = 600 * time.Millisecond, 400 * time.Millisecond
	l1, c, _ := newLocker(t, lock.WithFenceTTL(fenceTTL))
	_, nodes := redlockNodes(t, 3)
	for name, d := range map[string]struct {
		l     *lock.Locker
		nodes []redis.UniversalClient
	}{
		"single": {l1, []redis.UniversalClient{c}},
		// A node's part of an acquire may take its first dial and script
		// load: more than the 50 ms floor derived from this short ttl on a
		// loaded machine, and this test is about the counters.
		"redlock": {lock.NewRedlock(nodes, lock.WithFenceTTL(fenceTTL), lock.WithNodeTimeout(ttl/2)), nodes},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := lock.WithOwner(context.Background(), "owner-a")
			outer := mustAcquire(t, ctx, d.l, "kept", ttl)
			// Shorten every counter's life below the lock's ttl, then renew:
			// the renewal gives it ttl + fence TTL again. (Shortened to
			// ttl/2, not to a few ms: a node whose renewal arrives late on a
			// loaded machine must still have a counter to renew.)
			for _, n := range d.nodes {
				n.PExpire(ctx, d.l.FenceKey("kept"), ttl/2)
			}
			if err := outer.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			// Redlock's Renew returns once a quorum renewed: the other
			// nodes' renewals may still be on their way (they are bounded
			// by the node timeout, ttl/2).
			eventually(t, ttl/2, "every counter renewed to ttl + fence TTL", func() bool {
				for _, n := range d.nodes {
					if pttl := n.PTTL(ctx, d.l.FenceKey("kept")).Val(); pttl <= ttl || pttl > ttl+fenceTTL {
						return false
					}
				}
				return true
			})
			// Held for twice its first ttl + fence TTL, renewed every ttl/3.
			for end := time.Now().Add(2 * (ttl + fenceTTL)); time.Now().Before(end); {
				time.Sleep(ttl / 3)
				if err := outer.Renew(ctx); err != nil {
					t.Fatal(err)
				}
			}
			inner, err := d.l.TryAcquire(ctx, "kept", ttl)
			if err != nil {
				t.Fatalf("re-entry of a long hold: %v", err)
			}
			if inner.Fence() != outer.Fence() || inner.Token() != outer.Token() {
				t.Fatalf("re-entry got fence %d token %q, want the hold's %d %q", inner.Fence(), inner.Token(), outer.Fence(), outer.Token())
			}
			for _, s := range []*lock.Lease{inner, outer} {
				if err := s.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestReleasesRetireCountersIntoTheSlotFloor: a job's release (HandOn) and a
// permit's release each delete the counter of the permit they free and
// leave its fence in the slot's floor, so the next holder of either permit
// still gets a greater fence; a hand-off to a waiter keeps the counter (the
// next holder's).
func TestReleasesRetireCountersIntoTheSlotFloor(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	take := func(id string) lock.Taken {
		t.Helper()
		r, err := l.Take(ctx, "retire", "default", id, time.Minute, time.Minute, true, "", 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := take("a"), take("b")
	if a.Lease == nil || b.Lease == nil {
		t.Fatalf("two tasks of limit 2: %+v %+v", a, b)
	}
	take("c") // waits
	h, err := l.HandOn(ctx, b.Lease, lock.HandOff{Chain: true, Queue: "default", ID: "b", Outcome: "ok", MarkerTTL: time.Minute})
	if err != nil || h.Next == nil || h.Next.ID != "c" {
		t.Fatalf("hand-on to c: %+v %v", h.Next, err)
	}
	if c.Exists(ctx, l.PermitFenceKey("retire", b.Lease.Permit())).Val() != 1 {
		t.Fatal("a hand-off deleted the counter its next holder goes on with")
	}
	cl := l.Adopt(h.Next, time.Minute)
	if _, err := l.HandOn(ctx, cl, lock.HandOff{Queue: "default", ID: "c", Outcome: "ok", MarkerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := a.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, l.PermitFenceKey("retire", 0), l.PermitFenceKey("retire", 1)).Val(); n != 0 {
		t.Fatalf("%d counters left after every permit was released, want 0", n)
	}
	last := max(a.Lease.Fence(), h.Next.Fence)
	if floor, _ := c.Get(ctx, l.FenceFloorKey("retire")).Int64(); floor != last {
		t.Fatalf("slot floor %d, want the largest fence released, %d", floor, last)
	}
	for _, id := range []string{"d", "e"} {
		if r := take(id); r.Lease == nil || r.Lease.Fence() <= last {
			t.Fatalf("task %s after the releases: %+v, want a permit above fence %d", id, r, last)
		}
	}
}
