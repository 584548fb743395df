package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Fault tests on a 3-member etcd cluster. The locks have a 3s TTL (etcd's
// leases count whole seconds; 2s was seen too short once, on a loaded
// 2-core machine where the members' 100ms elections can repeat) and the
// watchdog renews every 200ms.
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
	l := lock.NewEtcd(cluster.Client())
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
	from := h.renewed()
	cancelled := func() {
		for i, ctx := range h.ctxs {
			if ctx.Err() != nil {
				t.Fatalf("%s: holder %d cancelled after %.0f renewals: %v", what, i, h.renewed()-from, context.Cause(ctx))
			}
		}
	}
	eventually(t, 30*time.Second, "renewals after "+what, func() bool {
		cancelled() // a lost hold renews no more: say so at once, with its cause
		return h.renewed() >= from+float64(etcdHeld)*float64(etcdTTL/etcdInterval)
	})
	cancelled()
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

func TestEtcdClusterKeepsEveryLockWhenTheLeaderIsKilled(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	h.keepsEveryLock(t, "start")
	h.cluster.Leader().Kill()
	h.keepsEveryLock(t, "the leader was killed")
}

func TestEtcdClusterKeepsEveryLockWhenTheLeaderIsPaused(t *testing.T) {
	t.Parallel()
	h := holdOnEtcdCluster(t)
	leader := h.cluster.Leader()
	leader.Pause()
	t.Cleanup(leader.Resume)
	h.keepsEveryLock(t, "the leader was paused")
	leader.Resume()
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
