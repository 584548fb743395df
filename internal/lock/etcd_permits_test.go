package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Permits on etcd: permit k of R is the key P{R} (k = 0) or P{R}:p<k>, bound
// to its holder's lease, its fence its create revision.

func TestEtcdPermitsAreKeysUnderTheResource(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	admin := cluster.Client()
	l := d.locker(lock.WithPrefix("p:"))
	ctx := context.Background()
	var held [3]*lock.Lease
	for k := range held {
		held[k] = tryPermit(t, l, "r", 3)
		if held[k].Permit() != k {
			t.Fatalf("holder %d got permit %d, want the lowest free, %d", k, held[k].Permit(), k)
		}
	}
	if _, err := l.TryAcquire(ctx, "r", time.Minute, lock.Permits(3)); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a fourth holder of limit 3: %v, want ErrNotAcquired", err)
	}
	for k, key := range []string{"p:{r}", "p:{r}:p1", "p:{r}:p2"} {
		resp, err := admin.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("permit %d's key %s: %v %v", k, key, resp, err)
		}
		kv := resp.Kvs[0]
		if string(kv.Value) != held[k].Token() || kv.CreateRevision != held[k].Fence() || kv.Lease == 0 || held[k].RedisKey() != key {
			t.Fatalf("key %s = %q rev %d lease %x; want permit %d's token, fence = create revision %d, a lease",
				kv.Key, kv.Value, kv.CreateRevision, kv.Lease, k, held[k].Fence())
		}
	}
	if resp, err := admin.Get(ctx, "p:{r}:limit"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3" || resp.Kvs[0].Lease == 0 {
		t.Fatalf("limit key: %v %v, want 3 bound to a lease", resp, err)
	}
	// The operator's view: one entry per permit, with the limit.
	hs, err := l.Locks(ctx)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Locks: %+v %v, want the 3 permits", hs, err)
	}
	for _, h := range hs {
		if h.Resource != "r" || h.Limit != 3 || h.Token != held[h.Permit].Token() || h.Fence != held[h.Permit].Fence() || h.TTL <= 0 {
			t.Fatalf("Locks: %+v, want permit %d of r, limit 3, its token and fence", h, h.Permit)
		}
	}
	if n, err := l.Limit(ctx, "r"); err != nil || n != 3 {
		t.Fatalf("Limit: %d %v, want 3", n, err)
	}
	old := held[1].Fence()
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := tryPermit(t, l, "r", 3)
	if next.Permit() != 1 || next.Fence() <= old {
		t.Fatalf("after permit 1's release: permit %d fence %d, want permit 1 with a fence above %d", next.Permit(), next.Fence(), old)
	}
	for _, s := range []*lock.Lease{held[0], next, held[2]} {
		if err := s.Renew(ctx); err != nil {
			t.Fatalf("permit %d: renew: %v", s.Permit(), err)
		}
	}
	// Broken by the operator: that permit alone is lost.
	h, err := l.HeldPermit(ctx, "r", 2)
	if err != nil || h == nil || h.Token != held[2].Token() {
		t.Fatalf("HeldPermit 2: %+v %v", h, err)
	}
	if ok, err := l.Break(ctx, *h); !ok || err != nil {
		t.Fatalf("Break permit 2: %v %v", ok, err)
	}
	if err := held[2].Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("renew of a broken permit: %v, want ErrLockLost", err)
	}
	for _, s := range []*lock.Lease{held[0], next} {
		if err := s.Renew(ctx); err != nil {
			t.Fatalf("permit %d after another's break: %v", s.Permit(), err)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// No permit held: no key of the resource is left, the limit included.
	if resp, err := admin.Get(ctx, "p:{r}", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("keys left of a free resource: %v %v", resp, err)
	}
}

// TestEtcdPermitsUnderContentionNeverOverlap: 16 contenders on 4 clients (as
// 4 processes) cycle one resource of limit 4: never more than 4 hold it, one
// permit never two, and every permit's fences increase.
func TestEtcdPermitsUnderContentionNeverOverlap(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	lockers := []*lock.Locker{d.locker(), d.locker(), d.locker(), d.locker()}
	contendPermits(t, lockers, lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: 10 * time.Millisecond}))
}

func TestEtcdPermitsFollowTheResourcesLimit(t *testing.T) {
	t.Parallel()
	d := etcdDeployment(t, etcdtest.Start(t))
	t.Run("lowered", func(t *testing.T) { t.Parallel(); checkLoweredLimit(t, d.locker()) })
	t.Run("different", func(t *testing.T) { t.Parallel(); checkDifferentLimits(t, d.locker()) })
	t.Run("reentrancy", func(t *testing.T) { t.Parallel(); checkPermitReentrancy(t, d.locker()) })
	t.Run("crashed holder", func(t *testing.T) {
		t.Parallel()
		// An etcd lease counts whole seconds: the crashed holder's is 1s.
		checkCrashedPermit(t, d.locker(), d.locker(), time.Second, 3*time.Second)
	})
}

// A permit deleted or overwritten in etcd cancels its holder at once (the
// watch), and only it.
func TestEtcdLostPermitCancelsItsHolderAtOnce(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	admin := cluster.Client()
	l := d.locker()
	wd := watchdog.New(watchdog.Options{})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	ctx := context.Background()
	var hctxs []context.Context
	var leases []*lock.Lease
	for range 3 {
		lease := tryPermit(t, l, "tenant", 3)
		hctx, hold := wd.Hold(ctx, lease)
		t.Cleanup(hold.Stop)
		leases, hctxs = append(leases, lease), append(hctxs, hctx)
	}
	for _, c := range []struct {
		k      int
		change func(key string) error
		reason lock.Reason
	}{
		{1, func(key string) error { _, err := admin.Delete(ctx, key); return err }, lock.ReasonExpired},
		{2, func(key string) error { _, err := admin.Put(ctx, key, "someone else"); return err }, lock.ReasonStolen},
	} {
		start := time.Now()
		if err := c.change(leases[c.k].RedisKey()); err != nil {
			t.Fatal(err)
		}
		at, reason := lostWithin(t, hctxs[c.k], 5*time.Second)
		if reason != c.reason || at.Sub(start) > 500*time.Millisecond || !errors.Is(context.Cause(hctxs[c.k]), lock.ErrLockLost) {
			t.Fatalf("permit %d: %s after %v (%v), want %s at once", c.k, reason, at.Sub(start), context.Cause(hctxs[c.k]), c.reason)
		}
	}
	if err := hctxs[0].Err(); err != nil {
		t.Fatalf("permit 0 after the others' losses: %v", err)
	}
}

// TestEtcdMixedLimitsAdmitNoOneAtOrAboveTheirLimit: contenders of limit 2 and
// of limit 3 cycle one resource on 3 clients. etcd's history of the permit
// keys, in revision order, shows each permit taken only while fewer than its
// taker's limit were held (the latest declarer's limit: a lowered one
// admits no one until below it), and no permit taken twice at once.
func TestEtcdMixedLimitsAdmitNoOneAtOrAboveTheirLimit(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	admin := cluster.Client()
	ctx := context.Background()
	start, err := admin.Get(ctx, "ready")
	if err != nil {
		t.Fatal(err)
	}
	lockers := []*lock.Locker{d.locker(), d.locker(), d.locker()}
	var limits sync.Map // token -> limit
	const workers, cycles = 12, 25
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			limit := 2 + w%2
			for range cycles {
				lease, err := lockers[w%len(lockers)].Acquire(ctx, "mixed", 10*time.Second, lock.Permits(limit),
					lock.MaxWait(20*time.Second), lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: 5 * time.Millisecond}))
				if err != nil {
					errs <- err
					return
				}
				limits.Store(lease.Token(), limit)
				time.Sleep(time.Millisecond)
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
	end, err := admin.Get(ctx, "ready")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := admin.Watch(wctx, lock.DefaultPrefix+"{mixed}", clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1))
	held := map[string]string{} // permit key -> token
	taken := 0
	for rev := start.Header.Revision; rev < end.Header.Revision; {
		resp, ok := <-wch
		if !ok || resp.Err() != nil {
			t.Fatalf("watch of the history: %v", resp.Err())
		}
		for _, ev := range resp.Events {
			rev = ev.Kv.ModRevision
			key := string(ev.Kv.Key)
			if key != lock.DefaultPrefix+"{mixed}" && !strings.HasPrefix(key, lock.DefaultPrefix+"{mixed}:p") {
				continue
			}
			switch {
			case ev.Type == clientv3.EventTypeDelete:
				delete(held, key)
			case ev.IsCreate():
				v, _ := limits.Load(string(ev.Kv.Value))
				limit, _ := v.(int)
				if len(held) >= limit {
					t.Fatalf("revision %d: %s taken by a holder of limit %d while %d were held: %v", rev, key, limit, len(held), held)
				}
				held[key] = string(ev.Kv.Value)
				taken++
			default: // a release's hand-off to the first in line: as many held, below its limit
				v, _ := limits.Load(string(ev.Kv.Value))
				limit, _ := v.(int)
				if _, ok := held[key]; !ok || len(held) > limit {
					t.Fatalf("revision %d: %s handed to a holder of limit %d while %d were held: %v", rev, key, limit, len(held), held)
				}
				held[key] = string(ev.Kv.Value)
				taken++
			}
		}
	}
	if taken != workers*cycles {
		t.Fatalf("%d permits taken in the history, want %d", taken, workers*cycles)
	}
}

// TestEtcdWaiterWakesWhenAHolderLetsGo: etcd has no waiter queue, but a
// waiting Acquire watches its resource from its busy attempt's revision and
// tries again when a permit is let go, by a release or an expired lease, not
// at the end of its backoff delay (10 s here).
func TestEtcdWaiterWakesWhenAHolderLetsGo(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	l := etcdDeployment(t, cluster).locker()
	slow := lock.WithWaitBackoff(backoff.Jitter{Min: 10 * time.Second, Max: 10 * time.Second})
	// wait starts an Acquire of r with limit n and returns its result when
	// it ends: the lease, its busy attempts and when it returned.
	type result struct {
		lease    *lock.Lease
		attempts int
		at       time.Time
		err      error
	}
	wait := func(r string, n int) <-chan result {
		out := make(chan result, 1)
		go func() {
			var res result
			res.lease, res.err = l.Acquire(context.Background(), r, time.Minute, lock.Permits(n), slow,
				lock.MaxWait(30*time.Second), lock.CountAttempts(&res.attempts))
			res.at = time.Now()
			out <- res
		}()
		return out
	}
	check := func(t *testing.T, res result, from time.Time, what string) {
		t.Helper()
		switch {
		case res.err != nil:
			t.Fatalf("%s: %v", what, res.err)
		case res.attempts < 1:
			t.Fatalf("%s: the waiter's first attempt was not busy: nothing tested", what)
		case res.at.Sub(from) > 2*time.Second:
			t.Fatalf("%s: the waiter got it %v after, want well before its 10s backoff", what, res.at.Sub(from))
		}
		t.Logf("%s: the waiter got it %v after", what, res.at.Sub(from))
	}

	t.Run("a lock's release", func(t *testing.T) {
		t.Parallel()
		holder := tryPermit(t, l, "lock", 1)
		got := wait("lock", 1)
		waitingOnEtcd(t, l, "lock", 1)
		released := time.Now()
		if err := holder.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		check(t, <-got, released, "release")
	})
	t.Run("a permit's expiry", func(t *testing.T) {
		t.Parallel()
		keep := tryPermit(t, l, "limited", 2)
		// Never renewed: its key goes with its etcd lease, about 2 s on.
		short, err := l.TryAcquire(context.Background(), "limited", 2*time.Second, lock.Permits(2))
		if err != nil {
			t.Fatal(err)
		}
		got := wait("limited", 2)
		waitingOnEtcd(t, l, "limited", 1)
		// The test's own watch sees the key go: the waiter is timed from then.
		admin := cluster.Client()
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var gone time.Time
		for resp := range admin.Watch(wctx, short.RedisKey(), clientv3.WithRev(short.Fence())) {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					gone = time.Now()
				}
			}
			if !gone.IsZero() {
				break
			}
		}
		if gone.IsZero() {
			t.Fatal("the unrenewed permit's key was not deleted within 20s")
		}
		res := <-got
		check(t, res, gone, "expiry")
		if res.lease.Permit() != short.Permit() || keep.Permit() == short.Permit() {
			t.Fatalf("the waiter got permit %d, want the expired one, %d", res.lease.Permit(), short.Permit())
		}
	})
}

// TestEtcdWaitersOfOneProcessWakeInArrivalOrder: a release wakes the first
// waiting Acquire of the resource in this process, not all of them, so the
// waiters of one process take the lock in the order they came.
func TestEtcdWaitersOfOneProcessWakeInArrivalOrder(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	l := etcdDeployment(t, cluster).locker()
	slow := lock.WithWaitBackoff(backoff.Jitter{Min: 10 * time.Second, Max: 10 * time.Second})
	ctx := context.Background()
	holder := tryPermit(t, l, "r", 1)
	const waiters = 4
	got := make(chan int, waiters)
	leases := make([]*lock.Lease, waiters)
	for i := range waiters {
		go func() {
			lease, err := l.Acquire(ctx, "r", time.Minute, slow, lock.MaxWait(30*time.Second))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				got <- -1
				return
			}
			leases[i] = lease
			got <- i
		}()
		waitingOnEtcd(t, l, "r", i+1) // queued behind the ones before it
	}
	for want := range waiters {
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case i := <-got:
			if i != want {
				t.Fatalf("release %d went to waiter %d, want %d (arrival order)", want, i, want)
			}
			holder = leases[i]
		case <-time.After(5 * time.Second):
			t.Fatalf("release %d: no waiter got the lock within 5s (their backoff is 10s)", want)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitingOnEtcd waits until n Acquires of resource wait in its queue on
// etcd, in any process: each made its busy attempt and holds its place.
func waitingOnEtcd(t *testing.T, l *lock.Locker, resource string, n int) {
	t.Helper()
	redistest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d Acquires of %q waiting", n, resource), func() bool {
		ws, err := l.Waiters(context.Background(), resource)
		if err != nil {
			t.Fatal(err)
		}
		return len(ws) >= n
	})
}
