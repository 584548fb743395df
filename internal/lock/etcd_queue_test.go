package lock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// The waiter queue on etcd across processes (etcd_queue.go). The waiters run
// in child processes: this test binary run again with queueChildEnv set, as
// waiterProcess; TestMain sends it to queueChild instead of the tests.

// queueChildEnv, when set, names the child process (its waiters' job ids
// start with it); the other settings are queueChildEnv plus a suffix.
const queueChildEnv = "LOCKSTEP_ETCD_QUEUE_CHILD"

// queueChild is a waiter process: on etcd at queueChildEnv_ENDPOINTS, for
// every resource named by a key put under queueChildEnv_ROUNDS, it starts
// queueChildEnv_WAITERS Acquires of it (ttl queueChildEnv_TTL), as the job
// "<child>-w<i>" (so that the lock's value and the queue say which waiter
// it is), and releases each lock as soon as it has it. It logs one JSON
// line, ready, once it watches for rounds, and one per error; it runs
// until killed.
func queueChild() int {
	name := os.Getenv(queueChildEnv)
	env := func(k string) string { return os.Getenv(queueChildEnv + "_" + k) }
	say := func(msg string, kv ...any) {
		rec := map[string]any{"msg": msg, "child": name}
		for i := 0; i+1 < len(kv); i += 2 {
			rec[kv[i].(string)] = kv[i+1]
		}
		b, _ := json.Marshal(rec)
		fmt.Println(string(b))
	}
	waiters, _ := strconv.Atoi(env("WAITERS"))
	ttl, _ := time.ParseDuration(env("TTL"))
	cl, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(env("ENDPOINTS"), ","), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		say("error", "err", err.Error())
		return 1
	}
	l := etcdclient.NewLocker(cl)
	ctx := context.Background()
	rounds := cl.Watch(ctx, env("ROUNDS"), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-rounds // created: no round put from now on is missed
	say("ready")
	for resp := range rounds {
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			resource := string(ev.Kv.Value)
			for i := range waiters {
				go func() {
					jctx := lock.WithJob(ctx, fmt.Sprintf("%s-w%d", name, i), "queue-test")
					lease, err := l.Acquire(jctx, resource, ttl, lock.MaxWait(time.Minute))
					if err == nil {
						err = lease.Release(ctx)
					}
					if err != nil {
						say("error", "err", err.Error())
					}
				}()
			}
		}
	}
	return 0
}

// waiterProcess starts a child process of waiters on cluster (queueChild),
// killed when the test ends.
func waiterProcess(t *testing.T, cluster *etcdtest.Cluster, name, rounds string, waiters int, ttl time.Duration) *proctest.Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := &proctest.Log{}
	p := proctest.Start(t, proctest.Spec{What: "waiter process " + name, Bin: exe, Output: out, Env: append(os.Environ(),
		queueChildEnv+"="+name,
		queueChildEnv+"_ENDPOINTS="+strings.Join(cluster.Endpoints(), ","),
		queueChildEnv+"_ROUNDS="+rounds,
		queueChildEnv+"_WAITERS="+strconv.Itoa(waiters),
		queueChildEnv+"_TTL="+ttl.String(),
	)})
	out.Wait(t, 0, 30*time.Second, p.Exited(), name+"'s ready", proctest.Msg("ready"))
	t.Cleanup(func() {
		if rec := out.Find(proctest.Msg("error")); rec != nil {
			t.Errorf("waiter process %s: %v", name, rec["err"])
		}
	})
	return p
}

// queueOrder returns the job ids of resource's waiters, first first, once
// there are n of them.
func queueOrder(t *testing.T, l *lock.Locker, resource string, n int) []string {
	t.Helper()
	waitingOnEtcd(t, l, resource, n)
	ws, err := l.Waiters(context.Background(), resource)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, w := range ws {
		if w.Position != i+1 || !w.Live {
			t.Fatalf("waiter %d: %+v", i, w)
		}
		ids = append(ids, w.Caller.TaskID)
	}
	return ids
}

// servedOrder follows the lock key of resource in etcd from revision from
// on and returns the job ids of the holders it was given to (taken or
// handed over, in revision order), once there are n of them.
func servedOrder(t *testing.T, admin *clientv3.Client, l *lock.Locker, resource string, from int64, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ids []string
	for resp := range admin.Watch(ctx, l.Key(resource), clientv3.WithRev(from)) {
		for _, ev := range resp.Events {
			if id := lock.ParseToken(string(ev.Kv.Value)).TaskID; ev.Type == clientv3.EventTypePut && id != "" {
				ids = append(ids, id)
			}
		}
		if len(ids) >= n {
			return ids
		}
	}
	t.Fatalf("within 20s the lock of %s went to %d waiters, want %d: %v", resource, len(ids), n, ids)
	return nil
}

// TestEtcdWaitersOfEveryProcessAreServedInRevisionOrder: 3 processes of 4
// waiters each queue on a lock held by the test, their places interleaved
// as etcd commits them; once it is released, the lock goes to every waiter
// once, in the order of their places' revisions, which Waiters lists. 20
// runs (on 20 resources at once), then one more with the leader killed
// between queueing and serving: the places and their revisions are what
// the cluster committed, on a quorum, and the other two serve them.
func TestEtcdWaitersOfEveryProcessAreServedInRevisionOrder(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	admin := cluster.Client()
	l := etcdDeployment(t, cluster).locker()
	const processes, each, runs = 3, 4, 20
	for i := range processes {
		waiterProcess(t, cluster, fmt.Sprintf("c%d", i), "rounds/", each, 10*time.Second)
	}
	ctx := context.Background()
	// serve queues every waiter on each resource behind a hold of the
	// test's, calls queued (once all are queued), releases the holds and
	// checks the order each resource was served in.
	serve := func(resources []string, queued func()) {
		holders := make([]*lock.Lease, len(resources))
		for i, r := range resources {
			var err error
			// Acquire, not TryAcquire: it rides out a leader change that a
			// loaded machine can cause. Nothing renews these holds: their
			// TTL outlasts the queueing of every run, which took over 10 s
			// on a loaded machine.
			if holders[i], err = l.Acquire(ctx, r, time.Minute, lock.MaxWait(10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Put(ctx, "rounds/"+r, r); err != nil {
				t.Fatal(err)
			}
		}
		orders := make([][]string, len(resources))
		interleaved := 0
		for i, r := range resources {
			orders[i] = queueOrder(t, l, r, processes*each)
			if mixed(orders[i]) {
				interleaved++
			}
		}
		t.Logf("%d of %d runs had the processes' places interleaved", interleaved, len(resources))
		if interleaved == 0 && len(resources) == runs {
			t.Fatal("no run had the processes' places interleaved: the order across processes was not tested")
		}
		queued()
		for _, h := range holders {
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range resources {
			served := servedOrder(t, admin, l, r, holders[i].Fence()+1, processes*each)
			if !slices.Equal(served, orders[i]) {
				t.Fatalf("%s served in the order\n%v\nwant the queue's (revision) order\n%v", r, served, orders[i])
			}
			waitingOnEtcd(t, l, r, 0)
			if ws, _ := l.Waiters(ctx, r); len(ws) != 0 {
				t.Fatalf("%s: %d waiters left after every one was served", r, len(ws))
			}
		}
	}
	var resources []string
	for i := range runs {
		resources = append(resources, fmt.Sprintf("run-%d", i))
	}
	start := time.Now()
	serve(resources, func() {})
	t.Logf("%d runs: %v", runs, time.Since(start))
	start = time.Now()
	var killed *etcdtest.Member
	serve([]string{"leader-killed"}, func() {
		killed = cluster.Leader()
		killed.Kill()
		cluster.Leader() // a new one, elected by the other two
	})
	t.Logf("with the leader killed: %v", time.Since(start))
	killed.Restart() // with its data: it rejoins as a follower
	killed.WaitHealthy()
}

// mixed reports whether the waiters of one process (job ids "<child>-w<i>")
// are not all next to each other in ids.
func mixed(ids []string) bool {
	seen := map[string]bool{}
	last := ""
	for _, id := range ids {
		child, _, _ := strings.Cut(id, "-")
		if child != last && seen[child] {
			return true
		}
		seen[child], last = true, child
	}
	return false
}

// TestEtcdKilledWaiterIsSkippedWithinItsLeaseTTL: of three waiters in line,
// the middle one's process is killed (SIGKILL): the lock goes to the first,
// and then to the last within the dead waiter's lease TTL (1s) and etcd's
// check for expired leases (every 500ms), whether the dead place was handed
// the lock before its lease expired or not.
func TestEtcdKilledWaiterIsSkippedWithinItsLeaseTTL(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	admin := cluster.Client()
	l := etcdDeployment(t, cluster).locker()
	ctx := context.Background()
	const ttl, expiryCheck, slack = time.Second, 500 * time.Millisecond, time.Second
	victim := waiterProcess(t, cluster, "victim", "victim/", 1, ttl)
	holder, err := l.Acquire(ctx, "r", 10*time.Second, lock.MaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 2)
	wait := func(id string) {
		go func() {
			lease, err := l.Acquire(lock.WithJob(ctx, id, "queue-test"), "r", 10*time.Second, lock.MaxWait(30*time.Second))
			if err != nil {
				t.Errorf("%s: %v", id, err)
			}
			got <- lease
		}()
	}
	wait("first")
	waitingOnEtcd(t, l, "r", 1)
	if _, err := admin.Put(ctx, "victim/r", "r"); err != nil {
		t.Fatal(err)
	}
	waitingOnEtcd(t, l, "r", 2)
	wait("last")
	if order := queueOrder(t, l, "r", 3); !slices.Equal(order, []string{"first", "victim-w0", "last"}) {
		t.Fatalf("queue %v, want first, victim-w0, last", order)
	}
	victim.Kill()
	killed := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"first", "last"} {
		select {
		case lease := <-got:
			if lease == nil {
				t.FailNow()
			}
			if id := lock.ParseToken(lease.Token()).TaskID; id != want {
				t.Fatalf("the lock went to %s, want %s", id, want)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(ttl + expiryCheck + slack):
			t.Fatalf("no lock for %s within %v of the kill", want, time.Since(killed))
		}
	}
	t.Logf("the last waiter got the lock %v after the middle one was killed (its lease: %v)", time.Since(killed), ttl)
}
