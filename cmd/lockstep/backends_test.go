package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// The operator's view on the strict back ends: the CLI binary against real
// servers, with holders under a watchdog in this process.

// holdUnder holds resource on l as a job's lock, under a watchdog that
// renews every 100ms, and returns the holder's context.
func holdUnder(t *testing.T, l *lock.Locker, resource, taskID string, ttl time.Duration, opts ...lock.AcquireOption) (*lock.Lease, context.Context) {
	t.Helper()
	wd := watchdog.New(watchdog.Options{Interval: 100 * time.Millisecond})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	lease, err := l.TryAcquire(lock.WithJob(context.Background(), taskID, "t:strict"), resource, ttl, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, hold := wd.Hold(context.Background(), lease)
	t.Cleanup(hold.Stop)
	return lease, ctx
}

// locksJSON runs `lockstep locks --json` with env and returns its locks.
func locksJSON(t *testing.T, env []string) []lockView {
	t.Helper()
	r := cliEnv(t, env, "", "locks", "--json")
	var ls []lockView
	if (r.code != 0 && r.code != 1) || json.Unmarshal([]byte(r.stdout), &ls) != nil {
		t.Fatalf("locks --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	return ls
}

// lostAs waits for ctx's cancellation and checks its cause is a loss with
// one of reasons.
func lostAs(t *testing.T, ctx context.Context, reasons ...lock.Reason) {
	t.Helper()
	redistest.Receive(t, ctx.Done(), 5*time.Second, "the holder's cancellation")
	var lost *lock.LostError
	if cause := context.Cause(ctx); !errors.As(cause, &lost) || !slices.Contains(reasons, lost.Reason) {
		t.Fatalf("holder cancelled with %v, want a loss (%v)", cause, reasons)
	}
}

func TestLocksWaitersAndUnlockOnEtcd(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	srv := redistest.Start(t) // the queue's Redis, where waiting tasks are
	l := etcdclient.NewLocker(cluster.Client())
	t.Cleanup(func() { _ = l.Close() })
	lease, ctx := holdUnder(t, l, "lock:order:7", "task-7", 2*time.Second)
	other, _ := holdUnder(t, l, "lock:order:8", "task-8", 2*time.Second)
	env := []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr, "LOCKSTEP_LOCK_BACKEND=etcd",
		"LOCKSTEP_LOCK_ETCD_ENDPOINTS=" + strings.Join(cluster.Endpoints(), ",")}

	ls := locksJSON(t, env)
	if len(ls) != 2 {
		t.Fatalf("locks on etcd: %+v, want 2", ls)
	}
	for _, v := range ls {
		want := map[string]*lock.Lease{"lock:order:7": lease, "lock:order:8": other}[v.Resource]
		if want == nil || v.Backend != "etcd" || v.Fence != want.Fence() || v.Type != "t:strict" ||
			v.TaskID != "task-"+strings.TrimPrefix(v.Resource, "lock:order:") || v.TTLMs <= 0 || v.TTLMs > 2000 ||
			v.HeldMs == nil || len(v.Nodes) != 0 {
			t.Fatalf("lock %+v, want the holder's fence %v, a job, a TTL left within 2s", v, want)
		}
	}
	if r := cliEnv(t, env, "", "locks"); r.code != 0 || !containsAll(r.stdout, "lock:order:7", "task-7", "t:strict") {
		t.Fatalf("locks on etcd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var page []lockView
	getJSON(t, startUIEnv(t, env)+"/api/locks", 200, &page)
	if len(page) != 2 || page[0].Backend != "etcd" || page[0].Fence != lease.Fence() {
		t.Fatalf("the page's locks on etcd: %+v, want lock:order:7 first with fence %d", page, lease.Fence())
	}
	if r := cliEnv(t, env, "", "waiters", "lock:order:7"); r.code != 1 || !strings.Contains(r.stderr, "nothing waits") {
		t.Fatalf("waiters on etcd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Two callers wait for lock:order:8, in etcd's queue, each from its own
	// Locker (as two processes would): the CLI and the page list them in
	// their places' order, and the lock counts them.
	wctx, stopWaiting := context.WithCancel(context.Background())
	var waiting sync.WaitGroup
	for i, id := range []string{"call-1", "call-2"} {
		wl := etcdclient.NewLocker(cluster.Client())
		t.Cleanup(func() { _ = wl.Close() })
		waiting.Go(func() { _, _ = wl.Acquire(lock.WithJob(wctx, id, "t:wait"), "lock:order:8", 2*time.Second) })
		redistest.WaitFor(t, 10*time.Second, id+" in lock:order:8's queue", func() bool {
			ws, err := l.Waiters(context.Background(), "lock:order:8")
			return err == nil && len(ws) == i+1
		})
	}
	var ws []waiterView
	if r := cliEnv(t, env, "", "waiters", "lock:order:8", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &ws) != nil ||
		len(ws) != 2 || ws[0].TaskID != "call-1" || ws[1].TaskID != "call-2" || ws[0].Position != 1 || ws[1].Position != 2 ||
		ws[0].Kind != "call" || ws[0].State != "waiting" || ws[0].Holder == "" {
		t.Fatalf("waiters on etcd: exit %d\n%s%s, want call-1 then call-2", r.code, r.stdout, r.stderr)
	}
	var o overview
	getJSON(t, startUIEnv(t, env)+"/api/overview", 200, &o)
	if got := o.Waiters["lock:order:8"]; len(got) != 2 || got[0].TaskID != "call-1" || got[1].TaskID != "call-2" {
		t.Fatalf("the page's waiters of lock:order:8 on etcd: %+v, want call-1 then call-2", got)
	}
	for _, v := range locksJSON(t, env) {
		if want := map[string]int64{"lock:order:7": 0, "lock:order:8": 2}[v.Resource]; v.Waiters != want {
			t.Fatalf("lock %s: %d waiters, want %d", v.Resource, v.Waiters, want)
		}
	}
	stopWaiting() // they give up and leave their places
	waiting.Wait()
	if ws, err := l.Waiters(context.Background(), "lock:order:8"); err != nil || len(ws) != 0 {
		t.Fatalf("waiters after they gave up: %+v %v", ws, err)
	}

	r := cliEnv(t, env, "", "unlock", "lock:order:7", "--force", "--yes")
	if r.code != 0 || !containsAll(r.stdout, "unlocked lock:order:7", "task-7") {
		t.Fatalf("unlock on etcd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lostAs(t, ctx, lock.ReasonExpired) // the holder's watch saw the delete
	if ls := locksJSON(t, env); len(ls) != 1 || ls[0].Resource != "lock:order:8" {
		t.Fatalf("after unlock: %+v, want only lock:order:8", ls)
	}
	if r := cliEnv(t, env, "", "unlock", "lock:order:7", "--force", "--yes"); r.code != 1 || !strings.Contains(r.stderr, "not locked") {
		t.Fatalf("unlock of a free lock on etcd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	next, err := l.TryAcquire(context.Background(), "lock:order:7", 2*time.Second)
	if err != nil || next.Fence() <= lease.Fence() {
		t.Fatalf("next holder: %v, fence %d, want one above %d", err, next.Fence(), lease.Fence())
	}
}

func TestLocksAndUnlockOnRedlock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t) // the queue's Redis
	var addrs []string
	var nodes []redis.UniversalClient
	for range 3 {
		n := redistest.Start(t)
		c := n.Client()
		t.Cleanup(func() { _ = c.Close() })
		addrs, nodes = append(addrs, n.Addr), append(nodes, c)
	}
	l := lock.NewRedlock(nodes)
	lease, ctx := holdUnder(t, l, "lock:order:1", "task-1", 2*time.Second)
	env := []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr, "LOCKSTEP_LOCK_BACKEND=redlock",
		"LOCKSTEP_LOCK_NODES=" + strings.Join(addrs, ",")}
	key := l.Key("lock:order:1")
	bg := context.Background()

	ls := locksJSON(t, env)
	if len(ls) != 1 || ls[0].Backend != "redlock" || ls[0].Fence != lease.Fence() || ls[0].TaskID != "task-1" ||
		!slices.Equal(ls[0].Nodes, addrs) || ls[0].TTLMs <= 0 || ls[0].TTLMs > 2000 {
		t.Fatalf("locks on redlock: %+v, want lock:order:1 on %v with fence %d", ls, addrs, lease.Fence())
	}
	var page []lockView
	getJSON(t, startUIEnv(t, env)+"/api/locks", 200, &page)
	if len(page) != 1 || page[0].Backend != "redlock" || !slices.Equal(page[0].Nodes, addrs) {
		t.Fatalf("the page's locks on redlock: %+v, want lock:order:1 on %v", page, addrs)
	}
	// A lock shows while a majority holds its token, with the nodes that agree.
	other, err := lock.NewRedlock(nodes).TryAcquire(bg, "lock:order:2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// TryAcquire returns once a majority holds it: the third node's write
	// may still be on its way. Deleted before it lands, the key would come
	// back.
	redistest.WaitFor(t, 5*time.Second, "lock:order:2 on every node", func() bool {
		for _, n := range nodes {
			if n.Exists(bg, l.Key("lock:order:2")).Val() != 1 {
				return false
			}
		}
		return true
	})
	if err := nodes[0].Del(bg, l.Key("lock:order:2")).Err(); err != nil {
		t.Fatal(err)
	}
	ls = locksJSON(t, env)
	if len(ls) != 2 || ls[1].Resource != "lock:order:2" || !slices.Equal(ls[1].Nodes, addrs[1:]) || ls[1].Fence != other.Fence() {
		t.Fatalf("lock held on 2 of 3 nodes: %+v, want lock:order:2 on %v", ls, addrs[1:])
	}
	nodes[1].Del(bg, l.Key("lock:order:2"))
	if ls = locksJSON(t, env); len(ls) != 1 || ls[0].Resource != "lock:order:1" {
		t.Fatalf("lock held on 1 of 3 nodes: %+v, want it left out", ls)
	}

	r := cliEnv(t, env, "", "unlock", "lock:order:1", "--force", "--yes")
	if r.code != 0 || !containsAll(r.stdout, "unlocked lock:order:1", "task-1", addrs[0], addrs[2]) {
		t.Fatalf("unlock on redlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for i, n := range nodes {
		if got := n.Exists(bg, key).Val(); got != 0 {
			t.Fatalf("node %d still has %s after unlock", i, key)
		}
	}
	lostAs(t, ctx, lock.ReasonExpired, lock.ReasonQuorumLost)
	if r := cliEnv(t, env, "", "waiters", "lock:order:1"); r.code != 1 {
		t.Fatalf("waiters on redlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cliEnv(t, env, "", "unlock", "lock:order:1", "--force", "--yes"); r.code != 1 {
		t.Fatalf("unlock of a free lock on redlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// A resource with a limit on etcd: locks --json shows its limit and one
// object per held permit; unlock --permit K breaks that permit alone.
func TestPermitsOnEtcd(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t)
	srv := redistest.Start(t)
	l := etcdclient.NewLocker(cluster.Client())
	t.Cleanup(func() { _ = l.Close() })
	var leases []*lock.Lease
	var ctxs []context.Context
	for k := range 3 {
		lease, ctx := holdUnder(t, l, "lock:tenant:7", fmt.Sprint("sync-", k), 5*time.Second, lock.Permits(3))
		leases, ctxs = append(leases, lease), append(ctxs, ctx)
	}
	env := []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr, "LOCKSTEP_LOCK_BACKEND=etcd",
		"LOCKSTEP_LOCK_ETCD_ENDPOINTS=" + strings.Join(cluster.Endpoints(), ",")}
	ls := locksJSON(t, env)
	if len(ls) != 3 {
		t.Fatalf("locks on etcd: %+v, want 3 permits", ls)
	}
	for _, v := range ls {
		if v.Resource != "lock:tenant:7" || v.Limit != 3 || v.Permit < 0 || v.Permit > 2 || v.Backend != "etcd" ||
			v.Fence != leases[v.Permit].Fence() || v.TaskID != fmt.Sprint("sync-", v.Permit) || v.TTLMs <= 0 || v.HeldMs == nil {
			t.Fatalf("permit %+v, want one of lock:tenant:7's 3 with its holder's fence and task", v)
		}
	}
	if r := cliEnv(t, env, "", "unlock", "lock:tenant:7", "--permit", "3", "--force", "--yes"); r.code != 2 || !strings.Contains(r.stderr, "out of range") {
		t.Fatalf("unlock --permit 3: exit %d, stderr %q; want 2, out of range", r.code, r.stderr)
	}
	r := cliEnv(t, env, "", "unlock", "lock:tenant:7", "--permit", "1", "--force", "--yes")
	if r.code != 0 || !containsAll(r.stdout, "permit 1 of lock:tenant:7", "sync-1") {
		t.Fatalf("unlock --permit 1: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lostAs(t, ctxs[1], lock.ReasonExpired)
	for _, k := range []int{0, 2} {
		if err := ctxs[k].Err(); err != nil {
			t.Fatalf("permit %d's holder after permit 1's unlock: %v", k, err)
		}
	}
	if ls := locksJSON(t, env); len(ls) != 2 || ls[0].Permit == 1 || ls[1].Permit == 1 {
		t.Fatalf("after unlock --permit 1: %+v, want permits 0 and 2", ls)
	}
}
