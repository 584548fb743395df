package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// etcdStore is store on etcd.
type etcdStore struct{ c *clientv3.Client }

func (e etcdStore) overwrite(t *testing.T, key, value string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	g, err := e.c.Grant(ctx, int64(max(ttl/time.Second, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Put(ctx, key, value, clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
}

func (e etcdStore) get(t *testing.T, key string) []string {
	t.Helper()
	resp, err := e.c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return []string{""}
	}
	return []string{string(resp.Kvs[0].Value)}
}

func (e etcdStore) ttl(t *testing.T, key string) []time.Duration {
	t.Helper()
	ctx := context.Background()
	resp, err := e.c.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("get %s: %v %v", key, resp, err)
	}
	l, err := e.c.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil {
		t.Fatal(err)
	}
	return []time.Duration{time.Duration(l.TTL) * time.Second}
}

// etcdDeployment is a deployment on cluster: each locker gets its own client,
// as another process would, closed (with the Locker) when the test ends.
func etcdDeployment(t *testing.T, cluster *etcdtest.Cluster) deployment {
	return deployment{
		locker: func(opts ...lock.Option) *lock.Locker {
			l := etcdclient.NewLocker(cluster.Client(), opts...)
			t.Cleanup(func() { _ = l.Close() })
			return l
		},
		store:  etcdStore{cluster.Client()},
		stolen: lock.ReasonStolen,
	}
}

func TestGuaranteesOnEtcd(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	t.Run("contention", func(t *testing.T) { t.Parallel(); checkContention(t, d, 8, 40) })
	t.Run("wrong token", func(t *testing.T) { t.Parallel(); checkWrongToken(t, d) })
	t.Run("stale holder", func(t *testing.T) { t.Parallel(); checkStaleHolder(t, d, time.Second) })
	t.Run("fence across holder and server restarts", func(t *testing.T) {
		checkEtcdFenceAcrossRestarts(t, d, cluster)
	})
}

// checkEtcdFenceAcrossRestarts: a holder that dies without releasing, a new
// process after it, and the etcd member restarted with its data: every fence
// is greater than the one before.
func checkEtcdFenceAcrossRestarts(t *testing.T, d deployment, cluster *etcdtest.Cluster) {
	ctx := context.Background()
	wait := []lock.AcquireOption{lock.MaxWait(10 * time.Second),
		lock.WithWaitBackoff(backoff.Jitter{Min: 5 * time.Millisecond, Max: 50 * time.Millisecond})}
	crashed := mustAcquire(t, ctx, d.locker(), "restarts", time.Second)
	last := crashed.Fence() // never released: its lease expires
	next, err := d.locker().Acquire(ctx, "restarts", time.Second, wait...)
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() <= last {
		t.Fatalf("fence after a crashed holder %d <= %d", next.Fence(), last)
	}
	last = next.Fence()
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cluster.Members[0].Restart()
	cluster.Members[0].WaitHealthy()
	after, err := d.locker().Acquire(ctx, "restarts", time.Second, wait...)
	if err != nil {
		t.Fatalf("acquire after the etcd restart: %v", err)
	}
	if after.Fence() <= last {
		t.Fatalf("fence after an etcd restart %d <= %d", after.Fence(), last)
	}
	if err := after.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestEtcdLockIsKeyBoundToLeaseWithRevisionFence(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	admin := cluster.Client()
	l := d.locker(lock.WithPrefix("p:"))
	ctx := context.Background()
	lease := mustAcquire(t, ctx, l, "r", 3*time.Second)
	if _, err := l.TryAcquire(ctx, "r", 3*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v, want ErrNotAcquired", err)
	}
	resp, err := admin.Get(ctx, "p:{r}")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lock key: %v %v", resp, err)
	}
	kv := resp.Kvs[0]
	if string(kv.Value) != lease.Token() || kv.CreateRevision != lease.Fence() || kv.Lease == 0 {
		t.Fatalf("key %s = %q rev %d lease %x; want token %q, fence = create revision %d, a lease",
			kv.Key, kv.Value, kv.CreateRevision, kv.Lease, lease.Token(), lease.Fence())
	}
	ttl, err := admin.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.GrantedTTL != 3 {
		t.Fatalf("lease granted TTL %v (%v), want 3s", ttl, err)
	}
	if err := lease.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, _ := admin.Get(ctx, "p:{r}"); len(resp.Kvs) != 0 {
		t.Fatal("Release left the key")
	}
	if l.Backend() != "etcd" || l.Quorum() != 0 || l.Nodes() != nil || l.SharesClient() {
		t.Fatalf("Backend %q Quorum %d Nodes %v SharesClient %v", l.Backend(), l.Quorum(), l.Nodes(), l.SharesClient())
	}
	for _, o := range []lock.Option{lock.WaitReplicas(1, time.Second), lock.WithFenceTTL(time.Hour), lock.WithNodeTimeout(time.Second)} {
		func() {
			defer func() {
				if r, _ := recover().(string); !strings.Contains(r, "does not apply to the etcd back end") {
					t.Fatalf("NewEtcd with a Redis option: panic %q", r)
				}
			}()
			etcdclient.NewLocker(admin, o)
		}()
	}
}

func TestEtcdReentrancy(t *testing.T) {
	t.Parallel()
	d := etcdDeployment(t, etcdtest.Start(t))
	checkReentrancy(t, d, d.locker(), d.locker(), "r", 5*time.Second) // another Locker, same owner
}

// The watch tells of a deleted or overwritten key at once, long before any
// renewal: the lease is marked lost and NotifyLoss's callback runs.
func TestEtcdLossNoticeIsImmediate(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	admin := cluster.Client()
	l := d.locker()
	type notice struct {
		lease *lock.Lease
		err   error
		at    time.Time
	}
	var mu sync.Mutex
	notices := make(chan notice, 4)
	if !l.NotifyLoss(func(s *lock.Lease, err error) {
		mu.Lock()
		defer mu.Unlock()
		notices <- notice{s, err, time.Now()}
	}) {
		t.Fatal("NotifyLoss: the etcd back end should have loss notices")
	}
	ctx := context.Background()
	deleted := mustAcquire(t, ctx, l, "deleted", time.Minute)
	overwritten := mustAcquire(t, ctx, l, "overwritten", time.Minute)
	released := mustAcquire(t, ctx, l, "released", time.Minute)
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lease  *lock.Lease
		change func() error
		reason lock.Reason
	}{
		{deleted, func() error { _, err := admin.Delete(ctx, deleted.RedisKey()); return err }, lock.ReasonExpired},
		{overwritten, func() error { _, err := admin.Put(ctx, overwritten.RedisKey(), "someone-else"); return err }, lock.ReasonStolen},
	} {
		start := time.Now()
		if err := c.change(); err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-notices:
			var lost *lock.LostError
			if n.lease != c.lease || !errors.As(n.err, &lost) || lost.Reason != c.reason {
				t.Fatalf("notice for %s: %v, want %s for %s", n.lease.Key(), n.err, c.reason, c.lease.Key())
			}
			if d := n.at.Sub(start); d > 500*time.Millisecond {
				t.Fatalf("notice after %v, want it at once", d)
			}
			if err := c.lease.Err(); !errors.Is(err, lock.ErrLockLost) {
				t.Fatalf("lease state after the notice: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no loss notice for %s", c.lease.Key())
		}
	}
	select {
	case n := <-notices:
		t.Fatalf("unexpected notice for %s: %v (a release is not a loss)", n.lease.Key(), n.err)
	default:
	}
}

// max_hold works as on Redis: the watchdog ends the hold, and the release
// that follows deletes the key, so the next holder gets it at once.
func TestEtcdMaxHoldFreesTheLockAtRelease(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	d := etcdDeployment(t, cluster)
	l := d.locker()
	wd := watchdog.New(watchdog.Options{MaxHold: 300 * time.Millisecond})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	ctx := context.Background()
	lease, hctx, hold := watched(t, wd, l, "bounded", 5*time.Second)
	if _, reason := lostWithin(t, hctx, 5*time.Second); reason != lock.ReasonMaxHold {
		t.Fatalf("reason %s, want max_hold", reason)
	}
	if lost, err := hold.Finish(ctx); err != nil || lost == nil || lost.Reason != lock.ReasonMaxHold {
		t.Fatalf("Finish after max_hold: %v, lost %v; want the max_hold loss", err, lost)
	}
	if got := d.store.get(t, lease.RedisKey()); got[0] != "" {
		t.Fatalf("the key still holds %q after the release", got[0])
	}
	if _, err := d.locker().TryAcquire(ctx, "bounded", 5*time.Second); err != nil {
		t.Fatalf("next holder: %v", err)
	}
}
