package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Fault tests on a 3-member etcd cluster (election timeout 100ms). The locks
// have a 3s TTL (etcd's leases count whole seconds) and the watchdog renews
// every 200ms. (At 2s a holder was once cancelled as unreachable before any
// fault, in make test on a busy machine: 20 acquires and the first renewals
// of a race-built client took longer than its 1.5s deadline.)
const (
	etcdTTL      = 3 * time.Second
	etcdInterval = 200 * time.Millisecond
	etcdDrift    = 500 * time.Millisecond
	etcdHeld     = 20
)

type etcdHolds struct {
	cluster *etcdtest.Cluster
	locker  *lock.Locker
	metrics *metrics.Metrics
	leases  []*lock.Lease
	ctxs    []context.Context
	holds   []*watchdog.Hold
}

// holdOnEtcdCluster starts a 3-member cluster and holds etcdHeld locks on it
// under a watchdog.
func holdOnEtcdCluster(t *testing.T) *etcdHolds {
	t.Helper()
	cluster := etcdtest.StartCluster(t, 3)
	l := etcdclient.NewLocker(cluster.Client())
	t.Cleanup(func() { _ = l.Close() })
	m := metrics.New(nil)
	wd := watchdog.New(watchdog.Options{Interval: etcdInterval, DriftMargin: etcdDrift, Metrics: m})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	h := &etcdHolds{cluster: cluster, locker: l, metrics: m}
	for i := range etcdHeld {
		lease := mustAcquire(t, context.Background(), l, fmt.Sprintf("held-%d", i), etcdTTL)
		ctx, hold := wd.Hold(context.Background(), lease)
		h.leases, h.ctxs, h.holds = append(h.leases, lease), append(h.ctxs, ctx), append(h.holds, hold)
	}
	t.Cleanup(func() {
		for _, hold := range h.holds {
			hold.Stop()
		}
	})
	return h
}

func (h *etcdHolds) renewed() float64 {
	return testutil.ToFloat64(h.metrics.Renewals.WithLabelValues(metrics.RenewalRenewed))
}

// keepsEveryLock waits for as many more renewals of every lock as one TTL
// holds at the watchdog's interval (so at least a TTL passes), and checks
// that no holder was cancelled and every key still holds its holder's token
// and fence. A member that hangs makes some rounds fail and be retried, so
// the rounds may take longer than their interval.
func (h *etcdHolds) keepsEveryLock(t *testing.T, what string) {
	t.Helper()
	h.renews(t, what, int(etcdTTL/etcdInterval), 30*time.Second)
	admin := h.cluster.Client()
	for _, lease := range h.leases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := admin.Get(ctx, lease.RedisKey())
		cancel()
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != lease.Token() ||
			resp.Kvs[0].CreateRevision != lease.Fence() {
			t.Fatalf("%s: key %s is %v (%v), want the holder's token and fence", what, lease.RedisKey(), resp, err)
		}
	}
}

// renews waits, for at most within, until every lock was renewed rounds more
// times, failing the test at once when a holder is cancelled.
func (h *etcdHolds) renews(t *testing.T, what string, rounds int, within time.Duration) {
	t.Helper()
	from := h.renewed()
	cancelled := func() {
		for i, ctx := range h.ctxs {
			if ctx.Err() != nil {
				t.Fatalf("%s: holder %d cancelled after %.0f renewals: %v", what, i, h.renewed()-from, context.Cause(ctx))
			}
		}
	}
	eventually(t, within, fmt.Sprintf("%d renewals of every lock after %s", rounds, what), func() bool {
		cancelled() // a lost hold renews no more: say so at once, with its cause
		return h.renewed() >= from+float64(etcdHeld*rounds)
	})
	cancelled()
}

func TestEtcdClusterKeepsEveryLockWhenTheLeaderIsKilled(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	h.keepsEveryLock(t, "start")
	h.cluster.Leader().Kill()
	h.keepsEveryLock(t, "the leader was killed")
}

// The leader is paused for less than the TTL: the others elect a new leader,
// the keep-alives reach it (every lock is renewed after the election, before
// the holders' local deadlines), and the old leader steps down when it
// resumes, leaving the leases alone. (A pause longer than the TTL is the
// test after the next.)
func TestEtcdClusterKeepsEveryLockWhenTheLeaderIsPaused(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	leader := h.cluster.Leader()
	paused := time.Now()
	leader.Pause()
	t.Cleanup(leader.Resume)
	if next := h.cluster.Leader(); next == leader {
		t.Fatalf("the paused member %s still reports itself leader", leader.Name)
	}
	// Before any holder's local deadline (last renewal + ttl − drift).
	h.renews(t, "the new leader's election", 1, time.Until(paused.Add(etcdTTL-etcdDrift)))
	leader.Resume()
	t.Logf("leader paused for %v", time.Since(paused).Round(time.Millisecond))
	h.keepsEveryLock(t, "the old leader resumed")
}

// With every member killed, each holder is cancelled (unreachable) before its
// lease could have expired on the server. The last renewal that succeeded
// was sent at most one interval (plus a round, bounded here by 100ms) before
// the kill, and etcd keeps a lease for its TTL from when it got that
// renewal, so no lease can expire before kill + ttl − interval − 100ms.
func TestEtcdClusterAllMembersKilledCancelsHoldersBeforeLeaseExpiry(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	h.keepsEveryLock(t, "start")
	killed := time.Now()
	for _, m := range h.cluster.Members {
		m.Kill()
	}
	earliestExpiry := killed.Add(etcdTTL - etcdInterval - 100*time.Millisecond)
	for i, ctx := range h.ctxs {
		at, reason := lostWithin(t, ctx, 5*time.Second)
		if reason != lock.ReasonUnreachable {
			t.Fatalf("holder %d: reason %s, want unreachable", i, reason)
		}
		if at.After(earliestExpiry) {
			t.Fatalf("holder %d cancelled %v after the kill, later than its lease could expire (%v)",
				i, at.Sub(killed), earliestExpiry.Sub(killed))
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := h.leases[0].Release(rctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release after the loss: %v, want ErrLockLost", err)
	}
}

// etcdLossLag bounds how long after another client took a lock whose key
// someone else deleted (here etcd's revocation) its holder is cancelled: no
// holder can hear of a deletion before the store lets another client act on
// it, so its watch, or failing that its next renewal (one interval and a
// round later), tells it a little after. In that window the fences, not the
// cancellation, keep a store safe. Seen: 50-75ms while the watch stayed on
// the resumed member; under 1ms since it moves off a member that hangs.
const etcdLossLag = etcdInterval + 100*time.Millisecond

// A leader paused for longer than the TTL. etcd 3.4.23 (Debian's) lets the
// resumed leader revoke the leases that ran out in its own view while it was
// stopped, before it learns it was replaced: a follower forwards the
// revocation to the new leader, which commits it though the holders kept
// their leases alive there (etcd issue 15247). So locks may be lost, some
// runs all of them, most runs none; what must hold is that a lost holder is
// cancelled (expired) and that anyone who takes its lock gets a higher
// fence. A contender tries every lock throughout; each lock it gets must
// have a higher fence and its holder cancelled within etcdLossLag.
func TestEtcdClusterLeaderPausedPastTheTTLCancelsEveryLostHolder(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	h.keepsEveryLock(t, "start")
	contender := etcdclient.NewLocker(h.cluster.Client())
	t.Cleanup(func() { _ = contender.Close() })
	stop := make(chan struct{})
	taken := make(chan int, etcdHeld)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { close(stop) })
	for i, lease := range h.leases {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				got, err := contender.TryAcquire(ctx, lease.Key(), etcdTTL)
				cancel()
				if err != nil {
					continue // busy, or the call went to the paused member
				}
				at := time.Now()
				if got.Fence() <= lease.Fence() {
					t.Errorf("lock %s taken with fence %d, not above its holder's %d", lease.Key(), got.Fence(), lease.Fence())
				}
				select {
				case <-h.ctxs[i].Done():
				case <-time.After(etcdLossLag):
					t.Errorf("lock %s taken (fence %d) and its holder (fence %d) not cancelled %v later",
						lease.Key(), got.Fence(), lease.Fence(), etcdLossLag)
				}
				if lag := time.Since(at); lag > time.Millisecond {
					t.Logf("lock %s: holder cancelled %v after the contender took it", lease.Key(), lag.Round(time.Millisecond))
				}
				taken <- i
				return
			}
		})
	}
	leader := h.cluster.Leader()
	leader.Pause()
	t.Cleanup(leader.Resume)
	paused := time.Now()
	rounds := 2 * int(etcdTTL/etcdInterval)
	h.renews(t, "the leader was paused", rounds, 30*time.Second)
	// The renewals keep about their pace: a call held by the paused member is
	// overtaken by a copy sent to another (without that, the 20 rounds took
	// four times as long).
	if took, nominal := time.Since(paused), time.Duration(rounds)*etcdInterval; took > 2*nominal {
		t.Errorf("%d renewal rounds took %v while the leader was paused, want at most %v", rounds, took, 2*nominal)
	}
	t.Logf("leader paused for %v", time.Since(paused).Round(time.Millisecond))
	leader.Resume()
	leader.WaitHealthy()
	// A TTL more: any revocation by the resumed member has happened (its
	// lessor looks every 500ms), and a lost holder's lock was taken.
	from := h.renewed()
	eventually(t, 30*time.Second, "a TTL of renewals after the resume", func() bool {
		return h.renewed() >= from+float64(etcdHeld-len(taken))*float64(etcdTTL/etcdInterval)
	})
	lost := 0
	for i, ctx := range h.ctxs {
		if ctx.Err() == nil {
			continue
		}
		lost++
		var le *lock.LostError
		if cause := context.Cause(ctx); !errors.As(cause, &le) || le.Reason != lock.ReasonExpired {
			t.Errorf("holder %d: cause %v, want a loss (expired)", i, cause)
		}
	}
	eventually(t, 10*time.Second, "the contender to take every lost lock", func() bool { return len(taken) >= lost })
	t.Logf("%d of %d locks lost after the resume", lost, etcdHeld)
}

// A member that hangs keeps no watch: with renewals far apart, so that only
// the watch can tell, a lock key deleted while one member is paused cancels
// its holder within a second, whichever member the watch was on (each
// member is paused in turn).
func TestEtcdClusterWatchLeavesAPausedMember(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	l := etcdclient.NewLocker(cluster.Client())
	t.Cleanup(func() { _ = l.Close() })
	wd := watchdog.New(watchdog.Options{Interval: 10 * time.Second})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	admin := cluster.Client()
	late := proctest.MeasureLateness(t)
	for i, m := range cluster.Members {
		lease := mustAcquire(t, context.Background(), l, fmt.Sprintf("watched-%d", i), 30*time.Second)
		ctx, hold := wd.Hold(context.Background(), lease)
		t.Cleanup(hold.Stop)
		m.Pause()
		for { // a call that the balancer gives the paused member hangs: try again
			dctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := admin.Delete(dctx, lease.RedisKey())
			cancel()
			if err == nil {
				break
			}
		}
		deleted := time.Now()
		at, reason := lostWithin(t, ctx, 5*time.Second)
		// A second, and what this machine's scheduling has added meanwhile.
		if bound := time.Second + late.Max(); reason != lock.ReasonExpired || at.Sub(deleted) > bound {
			t.Fatalf("%s paused: holder cancelled %v after the delete (%s), want expired within 1s + the timers' measured lateness %v",
				m.Name, at.Sub(deleted).Round(time.Millisecond), reason, late.Max())
		}
		t.Logf("%s paused: holder cancelled %v after the delete", m.Name, at.Sub(deleted).Round(time.Millisecond))
		m.Resume()
		m.WaitHealthy()
	}
}
