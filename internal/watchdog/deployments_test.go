package watchdog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// trackingWatchdog returns a Locker on c and a watchdog that learns of changes
// to its keys from c's tracking notices, stopped when the test ends.
func trackingWatchdog(t *testing.T, c redis.UniversalClient) (*lock.Locker, *watchdog.Watchdog) {
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	return l, wd
}

// checkNotice holds resource under a 30s TTL (next renewal 10s away), runs
// ready (until the notifier listens), deletes the key with del and checks
// that the holder sees the loss, as expired, within a second.
func checkNotice(t *testing.T, what string, l *lock.Locker, wd *watchdog.Watchdog, del func(key string) error, ready func(), resource string) {
	t.Helper()
	ctx, hold := holdOn(t, wd, l, resource, longTTL)
	defer hold.Stop()
	ready()
	deleted := time.Now()
	if err := del(l.Key(resource)); err != nil {
		t.Fatal(err)
	}
	at, reason := cancelled(t, ctx, 3*time.Second)
	d := at.Sub(deleted)
	t.Logf("%s: loss (%s) seen %v after the deletion", what, reason, d)
	if reason != lock.ReasonExpired || d > time.Second {
		t.Fatalf("%s: reason %q after %v, want expired within 1s", what, reason, d)
	}
}

// On Redis Cluster, each master has its tracking connection: a key deleted on
// any of them is seen within a second.
func TestNoticeOnCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	l, wd := trackingWatchdog(t, cl.Client())
	admin := cl.Client()
	del := func(k string) error { return admin.Del(context.Background(), k).Err() }
	nodes := map[string]bool{}
	for i := 0; len(nodes) < 3 && i < 100; i++ {
		res := fmt.Sprint("cl:", i)
		node := cl.NodeFor(l.Key(res))
		if nodes[node.Addr] {
			continue
		}
		nodes[node.Addr] = true
		nc := node.Client()
		checkNotice(t, "node "+node.Addr, l, wd, del, func() { waitListening(t, nc) }, res)
		nc.Close()
	}
	if len(nodes) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(nodes))
	}
}

// Through Sentinel, the tracking connection follows the master: a deletion is
// seen within a second, before and after a failover.
func TestNoticeThroughSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	c := s.Client()
	l, wd := trackingWatchdog(t, c)
	admin := s.Client()
	del := func(k string) error { return admin.Del(context.Background(), k).Err() }

	old := s.Master()
	m := old.Client()
	checkNotice(t, "before the failover", l, wd, del, func() { waitListening(t, m) }, "s:before")
	s.Failover()
	// The old master is now a replica: the notifier hears the new master's
	// writes through it (tracking works on replicas) or reconnects to it.
	redistest.WaitFor(t, 10*time.Second, "the failover client on the new master", func() bool {
		return c.Set(context.Background(), "probe", "1", time.Second).Err() == nil
	})
	// The replica link carries the acquire to the old master before the
	// deletion, so that a notifier listening there hears them apart.
	checkNotice(t, "after the failover", l, wd, del, func() {
		redistest.WaitFor(t, 5*time.Second, "the acquire on the old master, now a replica", func() bool {
			return m.Exists(context.Background(), l.Key("s:after")).Val() == 1
		})
	}, "s:after")
}

// On etcd, the back end's own watch tells the watchdog of a deleted key: the
// holder is cancelled within a second under a 30s TTL.
func TestNoticeOnEtcd(t *testing.T) {
	t.Parallel()
	cl := etcdtest.Start(t)
	l := etcdclient.NewLocker(cl.Client())
	defer l.Close()
	wd := watchdog.New(watchdog.Options{})
	defer wd.Stop(context.Background())
	admin := cl.Client()
	del := func(k string) error {
		_, err := admin.Delete(context.Background(), k)
		return err
	}
	checkNotice(t, "etcd", l, wd, del, func() {}, "e")
}
