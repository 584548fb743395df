package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// TestSentinelFailoverWhileLockHeld measures what a Sentinel failover does to
// a held lock (the README's guarantees: a failover with asynchronous replication can lose a
// lock; WaitReplicas narrows the window). A holds a lock under the watchdog
// through a go-redis failover client; the sentinels fail the master over; B,
// another process, then tries the same lock on the new master.
//
// The loss needs a write the replica has not seen when it is promoted. On one
// machine replication takes microseconds, so each "gap" trial first cuts the
// replication link (the replica's reconnects are refused), as a slow or
// partitioned replica would, and then acquires:
//
//   - without WaitReplicas the acquire succeeds on the master alone, the
//     promoted replica never saw it, and B gets the lock: the watchdog must
//     then cancel A (its next renewal finds the token gone);
//   - with WaitReplicas(1) the acquire waits for the replica, gets no
//     acknowledgement and fails, so no lock exists for the failover to lose.
//
// B's fence is compared with A's: the fencing counter's last write, made on
// the old master only, is lost with the lock, but fences start from the
// server's clock, so B's must still be above A's.
//
// Control trials fail over with a healthy link. With a ttl well above the
// failover time the lock must survive: B finds it busy and A keeps it. With
// a ttl below it, renewals sent between the promotion and the clients'
// switch reach only the old master, the key expires on the new one, and B
// may get the lock: then too the watchdog must cancel A.
func TestSentinelFailoverWhileLockHeld(t *testing.T) {
	t.Parallel()
	const (
		ttl       = 5 * time.Second // well above a failover (~1.2s here)
		shortTTL  = time.Second     // below it
		interval  = 250 * time.Millisecond
		gapTrials = 5
		ctlTrials = 2
	)
	s := redistest.StartSentinel(t)
	opts := func(o *redis.FailoverOptions) {
		o.ContextTimeoutEnabled = true
		o.DialTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	}
	clientA, clientB := s.Client(opts), s.Client(opts)
	plainA := lock.New(clientA)
	waitingA := lock.New(clientA, lock.WaitReplicas(1, 200*time.Millisecond))
	lockerB := lock.New(clientB)
	wd := watchdog.New(watchdog.Options{Interval: interval})
	defer func() { _ = wd.Stop(context.Background()) }()
	ctx := context.Background()

	// acquireB tries once on the new master, retrying only transport errors
	// while B's client catches up with the switch.
	acquireB := func(key string, ttl time.Duration) (*lock.Lease, error) {
		deadline := time.Now().Add(3 * time.Second)
		for {
			lease, err := lockerB.TryAcquire(ctx, key, ttl)
			if err == nil || errors.Is(err, lock.ErrNotAcquired) || time.Now().After(deadline) {
				return lease, err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	type outcome struct {
		trials, acquiredA, refusedA, secondHolder, cancelledA, fenceNotAbove int
		cancelAfterFailover, overlaps                                        []time.Duration
	}
	trial := func(name string, gap bool, l *lock.Locker, ttl time.Duration, o *outcome) {
		o.trials++
		key := "failover-" + name
		// The resource was used before, so its fence counter exists on both
		// nodes, as for any busy resource.
		if warm, err := plainA.TryAcquire(ctx, key, ttl); err != nil {
			t.Fatalf("%s: warm-up acquire: %v", name, err)
		} else if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := clientA.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
			t.Fatalf("%s: WAIT after the warm-up: %d, %v", name, n, err)
		}
		master := s.Master()
		if gap {
			s.CutReplication(master)
			defer func() {
				s.HealReplication(master)
				s.WaitReplicaLinked(s.Replica())
			}()
		}
		lease, err := l.TryAcquire(ctx, key, ttl)
		switch {
		case errors.Is(err, lock.ErrReplicas):
			o.refusedA++
			return // no lock: nothing for a failover to lose
		case err != nil:
			t.Fatalf("%s: A's acquire: %v", name, err)
		}
		o.acquiredA++
		hctx, hold := wd.Hold(ctx, lease)
		defer hold.Stop()

		_, to := s.Failover()
		failedOver := time.Now()
		b, err := acquireB(key, ttl)
		bAt := time.Now()
		switch {
		case errors.Is(err, lock.ErrNotAcquired):
		case err != nil:
			t.Fatalf("%s: B's acquire on the new master %s: %v", name, to.Addr, err)
		default:
			o.secondHolder++
			if b.Fence() <= lease.Fence() {
				o.fenceNotAbove++
			}
			defer func() { _ = b.Release(ctx) }()
		}

		// A lost lock is noticed at A's next renewal on the new master; a
		// kept one is renewed there.
		wait := 4 * interval
		if b != nil {
			wait = ttl + time.Second
		}
		select {
		case <-hctx.Done():
			var lost *lock.LostError
			if cause := context.Cause(hctx); !errors.As(cause, &lost) {
				t.Fatalf("%s: A cancelled with %v, want a lost lock", name, cause)
			}
			cancelled := time.Now()
			o.cancelledA++
			o.cancelAfterFailover = append(o.cancelAfterFailover, cancelled.Sub(failedOver).Round(time.Millisecond))
			if b != nil {
				o.overlaps = append(o.overlaps, max(cancelled.Sub(bAt), 0).Round(time.Millisecond))
			}
			got := "no"
			if b != nil {
				got = fmt.Sprintf("yes, fence %d", b.Fence())
			}
			t.Logf("%s: A (fence %d) cancelled %v after the failover, reason %s; B got the lock: %s",
				name, lease.Fence(), cancelled.Sub(failedOver).Round(time.Millisecond), lost.Reason, got)
		case <-time.After(wait):
			if b != nil {
				t.Fatalf("%s: B holds the lock and A's context is still live %v after the failover", name, wait)
			}
			t.Logf("%s: A (fence %d) kept the lock across the failover; B found it busy", name, lease.Fence())
		}
	}

	var none, waited, control, short outcome
	for i := range gapTrials {
		trial(fmt.Sprintf("gap-none-%d", i), true, plainA, ttl, &none)
	}
	for i := range gapTrials {
		trial(fmt.Sprintf("gap-wait-%d", i), true, waitingA, ttl, &waited)
	}
	for i := range ctlTrials {
		trial(fmt.Sprintf("healthy-%d", i), false, plainA, ttl, &control)
	}
	for i := range ctlTrials {
		trial(fmt.Sprintf("healthy-short-ttl-%d", i), false, plainA, shortTTL, &short)
	}

	report := func(what string, o outcome) {
		t.Logf("%s: A acquired %d/%d (refused %d), B also got the lock %d/%d (its fence not above A's: %d), "+
			"A cancelled by the watchdog %d, at %v after the failover, %v after B got the lock",
			what, o.acquiredA, o.trials, o.refusedA, o.secondHolder, o.trials, o.fenceNotAbove,
			o.cancelledA, o.cancelAfterFailover, o.overlaps)
	}
	report("replication gap, no WaitReplicas, ttl 5s", none)
	report("replication gap, WaitReplicas(1, 200ms), ttl 5s", waited)
	report("healthy link, no WaitReplicas, ttl 5s", control)
	report("healthy link, no WaitReplicas, ttl 1s", short)

	if none.secondHolder == 0 {
		t.Fatal("without WaitReplicas no failover lost the lock: the replication gap was not real")
	}
	for _, o := range []outcome{none, waited, control, short} {
		if o.cancelledA < o.secondHolder {
			t.Fatalf("B got the lock %d times but the watchdog cancelled A only %d times", o.secondHolder, o.cancelledA)
		}
	}
	for _, o := range []outcome{none, short} {
		if o.fenceNotAbove != 0 {
			t.Fatalf("%d second holders after a failover got a fence not above the first's", o.fenceNotAbove)
		}
	}
	if waited.secondHolder != 0 || waited.acquiredA != 0 {
		t.Fatalf("with WaitReplicas: A acquired %d times and B got the lock %d times, want 0 and 0", waited.acquiredA, waited.secondHolder)
	}
	if control.secondHolder != 0 || control.cancelledA != 0 {
		t.Fatalf("healthy link, ttl 5s: B got the lock %d times, A cancelled %d times, want 0", control.secondHolder, control.cancelledA)
	}
}
