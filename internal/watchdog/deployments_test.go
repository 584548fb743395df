package watchdog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// noticeLatency holds resource under a 30s TTL (next renewal 10s away),
// deletes its key with admin once the notifier listens on node, and returns
// how long the holder took to see the loss.
func noticeLatency(t *testing.T, l *lock.Locker, wd *watchdog.Watchdog, del func(key string) error, node *redis.Client, resource string) time.Duration {
	t.Helper()
	ctx, hold := holdOn(t, wd, l, resource, longTTL)
	defer hold.Stop()
	waitListening(t, node)
	deleted := time.Now()
	if err := del(l.Key(resource)); err != nil {
		t.Fatal(err)
	}
	at, reason := cancelled(t, ctx, 3*time.Second)
	if reason != lock.ReasonExpired {
		t.Fatalf("%s: reason %q, want expired", resource, reason)
	}
	return at.Sub(deleted)
}

// On Redis Cluster, each master has its tracking connection: a key deleted on
// any of them is seen within a second.
func TestNoticeOnCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	c := cl.Client()
	defer c.Close()
	admin := cl.Client()
	defer admin.Close()
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	defer wd.Stop(context.Background())
	nodes := map[string]bool{}
	for i := 0; len(nodes) < 3 && i < 100; i++ {
		res := fmt.Sprint("cl:", i)
		node := cl.NodeFor(l.Key(res))
		if nodes[node.Addr] {
			continue
		}
		nodes[node.Addr] = true
		nc := node.Client()
		d := noticeLatency(t, l, wd, func(k string) error { return admin.Del(context.Background(), k).Err() }, nc, res)
		nc.Close()
		t.Logf("node %s: loss seen %v after the deletion", node.Addr, d)
		if d > time.Second {
			t.Fatalf("node %s: loss seen %v after the deletion, want within 1s", node.Addr, d)
		}
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
	defer c.Close()
	admin := s.Client()
	defer admin.Close()
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	defer wd.Stop(context.Background())
	del := func(k string) error { return admin.Del(context.Background(), k).Err() }

	m := s.Master().Client()
	d := noticeLatency(t, l, wd, del, m, "s:before")
	m.Close()
	t.Logf("before the failover: loss seen %v after the deletion", d)
	if d > time.Second {
		t.Fatalf("loss seen %v after the deletion, want within 1s", d)
	}
	_, to := s.Failover()
	nm := to.Client()
	defer nm.Close()
	// The old master is now a replica: the notifier hears the new master's
	// writes through it (tracking works on replicas) or reconnects to it.
	redistest.WaitFor(t, 10*time.Second, "the failover client on the new master", func() bool {
		return c.Set(context.Background(), "probe", "1", time.Second).Err() == nil
	})
	ctx, hold := holdOn(t, wd, l, "s:after", longTTL)
	defer hold.Stop()
	time.Sleep(200 * time.Millisecond) // the replica link carries the acquire
	deleted := time.Now()
	if err := del(l.Key("s:after")); err != nil {
		t.Fatal(err)
	}
	at, _ := cancelled(t, ctx, 3*time.Second)
	t.Logf("after the failover: loss seen %v after the deletion", at.Sub(deleted))
	if at.Sub(deleted) > time.Second {
		t.Fatalf("after the failover: loss seen %v after the deletion, want within 1s", at.Sub(deleted))
	}
}

// On etcd, the back end's own watch tells the watchdog of a deleted key: the
// holder is cancelled within a second under a 30s TTL.
func TestNoticeOnEtcd(t *testing.T) {
	t.Parallel()
	cl := etcdtest.Start(t)
	c := cl.Client()
	defer c.Close()
	admin := cl.Client()
	defer admin.Close()
	l := lock.NewEtcd(c)
	defer l.Close()
	wd := watchdog.New(watchdog.Options{})
	defer wd.Stop(context.Background())
	ctx, hold := holdOn(t, wd, l, "e", longTTL)
	defer hold.Stop()
	deleted := time.Now()
	if _, err := admin.Delete(context.Background(), l.Key("e")); err != nil {
		t.Fatal(err)
	}
	at, reason := cancelled(t, ctx, 3*time.Second)
	t.Logf("etcd: loss (%s) seen %v after the deletion", reason, at.Sub(deleted))
	if reason != lock.ReasonExpired || at.Sub(deleted) > time.Second {
		t.Fatalf("reason %q after %v, want expired within 1s", reason, at.Sub(deleted))
	}
}
