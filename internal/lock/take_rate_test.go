package lock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// One admission for a task's rate limit and its lock (Take with a TaskRate,
// lua/take.lua), on a lock and on a resource of two permits:
//   - both free: one script call takes the lock and counts the rate;
//   - the lock busy, the rate free: the task joins the waiters and its rate
//     is not touched (no turn spent while it waits);
//   - the lock free, the rate over: no lock is taken; the task takes its
//     turn and the lock is granted to it until then, so that another task
//     finds it busy (and spends no turn either); asked again on its turn,
//     it takes the grant over, admitted on that turn, without a second
//     count;
//   - a release's grant to a waiter over its rate: kept for it until its
//     turn, nothing taken.
func TestTakeDecidesTheRateWithTheLock(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		srv := redistest.Start(t)
		c := srv.Client()
		trips := &tripCounter{trips: map[string]int{}}
		trips.attach(c)
		l := lock.New(c)
		admin := srv.Client()
		ctx := context.Background()
		// One admission per 2 s, burst 1: the second within 2 s is over.
		slow := lock.Rate{N: 1, Per: 2 * time.Second, Burst: 1}
		take := func(resource, id, key string) lock.Taken {
			t.Helper()
			tk, err := l.Take(ctx, resource, "default", id, time.Minute, time.Minute, true, "", limit,
				&lock.TaskRate{Key: key, Rate: slow, Late: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return tk
		}
		rateOf := func(key string) string { return admin.Get(ctx, l.RateKey(key)).Val() }
		addr := c.Options().Addr
		roundTrips := func() int {
			trips.mu.Lock()
			defer trips.mu.Unlock()
			return trips.trips[addr]
		}

		// Both free: one call, both counted (after a first take that
		// dials and loads the script).
		take("warm", "warm", "rate:warm")
		before := roundTrips()
		var held []lock.Taken
		for i := range limit {
			id := "first" + string(rune('a'+i))
			tk := take("res", id, "rate:"+id) // a key of its own each: every permit can be taken
			if tk.Lease == nil || tk.RateWait != 0 || tk.Admitted.IsZero() {
				t.Fatalf("limit %d: lock and rate free: %+v, want a lease, admitted", limit, tk)
			}
			if rateOf("rate:"+id) == "" {
				t.Fatalf("limit %d: admitted, but its rate key was not counted", limit)
			}
			held = append(held, tk)
		}
		if n := roundTrips() - before; n != limit {
			t.Fatalf("limit %d: %d round trips for %d takes with their rates, want one each", limit, n, limit)
		}

		// The lock busy, the rate free: it waits, its rate untouched.
		w := take("res", "waiter", "rate:waiter")
		if w.Lease != nil || w.RateWait != 0 || w.Joined.IsZero() {
			t.Fatalf("limit %d: busy lock: %+v, want the task among the waiters", limit, w)
		}
		if v := rateOf("rate:waiter"); v != "" {
			t.Fatalf("limit %d: a task that waits for its lock spent a turn of its rate: %q", limit, v)
		}

		// The lock (the last permit) free, the rate over: no lock, its
		// turn taken, the lock kept for it.
		for i := 1; i < limit; i++ {
			id := "filler" + string(rune('a'+i))
			if tk := take("free", id, "rate:"+id); tk.Lease == nil {
				t.Fatalf("limit %d: %s: %+v, want a permit", limit, id, tk)
			} else {
				held = append(held, tk)
			}
		}
		counted := rateOf("rate:firsta")
		over := take("free", "late", "rate:firsta")
		if over.Lease != nil || over.RateWait <= 0 || over.RateWait > slow.Per {
			t.Fatalf("limit %d: rate over: %+v, want no lease and a wait up to %v", limit, over, slow.Per)
		}
		if v := rateOf("rate:firsta"); v == counted {
			t.Fatalf("limit %d: the task over its rate took no turn (rate key still %q)", limit, v)
		}
		if v := admin.Get(ctx, l.PermitKey("free", limit-1)).Val(); !strings.HasPrefix(v, "g:"+lock.TaskWaiter("default", "late")+":") {
			t.Fatalf("limit %d: the lock of a task over its rate holds %q, want it granted to the task", limit, v)
		}
		other := take("free", "other", "rate:other")
		if other.Lease != nil || other.Joined.IsZero() || rateOf("rate:other") != "" {
			t.Fatalf("limit %d: another task while the lock waits for a rate turn: %+v (rate %q), want it among the waiters, no turn spent",
				limit, other, rateOf("rate:other"))
		}
		if again := take("free", "late", "rate:firsta"); again.Lease != nil || again.RateWait <= 0 || !again.RateTurn.Equal(over.RateTurn) {
			t.Fatalf("limit %d: asked again before its turn: %+v, want the same turn %v", limit, again, over.RateTurn)
		}
		counted = rateOf("rate:firsta")
		time.Sleep(time.Until(over.RateTurn)) // the server's clock: this machine's
		var back lock.Taken
		redistest.WaitFor(t, 2*time.Second, "the task's turn on the server's clock", func() bool {
			back = take("free", "late", "rate:firsta")
			return back.RateWait == 0
		})
		if back.Lease == nil || !back.Granted || !back.Admitted.Equal(over.RateTurn) {
			t.Fatalf("limit %d: back on its turn: %+v, want the grant taken over, admitted at its turn %v", limit, back, over.RateTurn)
		}
		if v := rateOf("rate:firsta"); v != counted {
			t.Fatalf("limit %d: back on its turn, the rate was counted again: %q, was %q", limit, v, counted)
		}

		// A release hands the lock to the waiter, whose rate is over now:
		// its take keeps the grant for it until its turn and takes nothing.
		if _, err := l.Allow(ctx, "rate:other", slow); err != nil {
			t.Fatal(err)
		}
		if err := back.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		granted := take("free", "other", "rate:other")
		if granted.Lease != nil || granted.RateWait <= 0 {
			t.Fatalf("limit %d: a grant to a task over its rate: %+v, want no lease and a wait", limit, granted)
		}
		key := l.PermitKey("free", back.Lease.Permit())
		if v := admin.Get(ctx, key).Val(); !strings.HasPrefix(v, "g:"+lock.TaskWaiter("default", "other")+":") {
			t.Fatalf("limit %d: the grant to a task over its rate became %q, want it kept", limit, v)
		}
		if pttl := admin.PTTL(ctx, key).Val(); pttl < granted.RateWait+time.Minute-time.Second {
			t.Fatalf("limit %d: the grant kept for %v, want its wait %v + the ttl", limit, pttl, granted.RateWait)
		}
		for _, h := range held {
			if err := h.Lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A rate key in another Cluster slot than the resource cannot be decided in
// the lock's script: OneAdmission says so and Take refuses it, so the job
// server asks the rate first (two steps). On one server any key can.
func TestOneAdmissionNeedsOneSlot(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	if !l.OneAdmission("tenant:a", "order:1") {
		t.Fatal("one server: OneAdmission is false")
	}
	cl := redistest.StartCluster(t, 3)
	lc := lock.New(cl.Client())
	for _, same := range [][2]string{{"order:1", "order:1"}, {"{t}rate", "{t}lock"}} {
		if !lc.OneAdmission(same[0], same[1]) {
			t.Fatalf("a Cluster, rate key %q and resource %q in one slot: OneAdmission is false", same[0], same[1])
		}
	}
	if lc.OneAdmission("tenant:a", "order:1") {
		t.Fatal("a Cluster, keys in different slots: OneAdmission is true")
	}
	ctx := context.Background()
	_, err := lc.Take(ctx, "order:1", "default", "t1", time.Minute, time.Minute, true, "", 1,
		&lock.TaskRate{Key: "tenant:a", Rate: lock.Rate{N: 1, Per: time.Second}})
	if err == nil || !strings.Contains(err.Error(), "another Cluster slot") {
		t.Fatalf("Take with a rate key in another slot: %v, want refused", err)
	}
	tk, err := lc.Take(ctx, "order:1", "default", "t1", time.Minute, time.Minute, true, "", 1,
		&lock.TaskRate{Key: "order:1", Rate: lock.Rate{N: 1, Per: time.Second}})
	if err != nil || tk.Lease == nil || tk.Admitted.IsZero() {
		t.Fatalf("Take with a rate key in the resource's slot: %+v, %v; want the lock and the admission", tk, err)
	}
	if err := tk.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TakeOver decides a handed-on task's rate with its grant's take-over, one
// admission as Take's: without a rate the grant's lease is returned; over
// the rate by more than it may wait in the caller's slot, no lease and
// nothing counted (the caller leaves the task to its take); over by less, it
// waits for its turn holding the lock, and is admitted on it.
func TestTakeOverDecidesTheRate(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	// handOn returns a grant of resource handed on to the caller for task "next".
	handOn := func(resource string) *lock.TaskGrant {
		t.Helper()
		first, err := l.Take(ctx, resource, "default", "first", ttl, time.Minute, true, "", 1, nil)
		if err != nil || first.Lease == nil {
			t.Fatalf("take: %+v %v", first, err)
		}
		if w, err := l.Take(ctx, resource, "default", "next", ttl, time.Minute, true, "", 1, nil); err != nil || w.Lease != nil {
			t.Fatalf("a waiter's take: %+v %v", w, err)
		}
		h, err := l.HandOn(ctx, first.Lease, lock.HandOff{Chain: true, Queue: "default", ID: "first", Outcome: "ok", MarkerTTL: time.Minute})
		if err != nil || h.Next == nil || h.Next.ID != "next" {
			t.Fatalf("hand-on: %+v %v", h, err)
		}
		return h.Next
	}

	g := handOn("plain")
	tk, err := l.TakeOver(ctx, g, ttl, nil)
	if err != nil || tk.Lease == nil || tk.Lease.Fence() != g.Fence || tk.Waited != 0 || !tk.Admitted.IsZero() {
		t.Fatalf("no rate: %+v %v, want the grant's lease (fence %d)", tk, err, g.Fence)
	}
	if err := tk.Lease.Renew(ctx); err != nil {
		t.Fatalf("the taken-over lease: %v", err)
	}

	// Over by far more than it may wait (Late): no lease, nothing counted.
	slow := lock.Rate{N: 1, Per: 10 * time.Second, Burst: 1}
	if wait, _, err := l.AllowAt(ctx, "rate:far", slow); err != nil || wait != 0 {
		t.Fatalf("the first admission: %v %v", wait, err)
	}
	counted := c.Get(ctx, l.RateKey("rate:far")).Val()
	g = handOn("far")
	tk, err = l.TakeOver(ctx, g, ttl, &lock.TaskRate{Key: "rate:far", Rate: slow, Late: 100 * time.Millisecond})
	if err != nil || tk.Lease != nil || tk.RateWait <= 100*time.Millisecond || tk.Waited != 0 {
		t.Fatalf("far over its rate: %+v %v, want no lease and its wait", tk, err)
	}
	if v := c.Get(ctx, l.RateKey("rate:far")).Val(); v != counted {
		t.Fatalf("a task left to its take spent a turn: rate %q, was %q", v, counted)
	}

	// Over by less than Late: it waits for its turn here and is admitted on it.
	quick := lock.Rate{N: 1, Per: 300 * time.Millisecond, Burst: 1}
	_, first, err := l.AllowAt(ctx, "rate:near", quick)
	if err != nil {
		t.Fatal(err)
	}
	g = handOn("near")
	tk, err = l.TakeOver(ctx, g, ttl, &lock.TaskRate{Key: "rate:near", Rate: quick, Late: time.Second})
	if err != nil || tk.Lease == nil || tk.Waited <= 0 || tk.Lease.Fence() != g.Fence {
		t.Fatalf("near its turn: %+v %v, want the lease after a wait", tk, err)
	}
	if gap := tk.Admitted.Sub(first); gap < quick.Interval()-time.Millisecond {
		t.Fatalf("admitted %v after the last admission, want its turn, %v after", gap, quick.Interval())
	}
	if err := tk.Lease.Renew(ctx); err != nil {
		t.Fatalf("the lease after the wait: %v", err)
	}
}
