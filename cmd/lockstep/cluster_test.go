package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// On a Redis Cluster, locks reads every master, and unlock deletes the key
// on the master that holds it.
func TestLocksAndUnlockOnCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	client := c.Client()
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	l := lock.New(client)
	const n = 12 // spread over the three masters' slots
	for i := range n {
		if _, err := l.TryAcquire(lock.WithJob(ctx, fmt.Sprintf("task-%d", i), "t:cluster"), fmt.Sprintf("res:%d", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	env := clusterEnv(c)
	locks := func() []lockView {
		r := cliEnv(t, env, "", "locks", "--json")
		var ls []lockView
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ls) != nil {
			t.Fatalf("locks --json on a cluster: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return ls
	}
	ls := locks()
	seen := map[string]bool{}
	for _, v := range ls {
		if v.Type != "t:cluster" || v.TaskID != "task-"+strings.TrimPrefix(v.Resource, "res:") || v.Fence <= 0 {
			t.Fatalf("lock %+v", v)
		}
		seen[v.Resource] = true
	}
	if len(ls) != n || len(seen) != n {
		t.Fatalf("locks on a cluster: %d (%d distinct), want %d", len(ls), len(seen), n)
	}
	if r := cliEnv(t, env, "", "unlock", "res:5", "--force", "--yes"); r.code != 0 {
		t.Fatalf("unlock on a cluster: exit %d: %s", r.code, r.stderr)
	}
	if got := len(locks()); got != n-1 {
		t.Fatalf("after unlock: %d locks, want %d", got, n-1)
	}
}

// clusterEnv points a binary at the Redis Cluster c.
func clusterEnv(c *redistest.Cluster) []string {
	return []string{"LOCKSTEP_REDIS_MODE=cluster", "LOCKSTEP_REDIS_ADDRS=" + strings.Join(c.Addrs(), ",")}
}

// clusterWorkerYAML is workerYAML with a 1 s TTL, so that a killed worker's
// lock expires soon.
var clusterWorkerYAML = strings.Replace(workerYAML, "ttl: 2s", "ttl: 1s", 1)

const clusterTTL = time.Second

// ordersOnEveryMaster returns one order id per master of c: the lock keys
// of their resources hash to slots of different masters.
func ordersOnEveryMaster(t *testing.T, c *redistest.Cluster, prefix string) []string {
	t.Helper()
	seen := map[*redistest.Server]bool{}
	var orders []string
	for i := 0; len(orders) < len(c.Nodes) && i < 100; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if n := c.NodeFor(lock.DefaultPrefix + "{" + demo.Resource(id) + "}"); !seen[n] {
			seen[n] = true
			orders = append(orders, id)
		}
	}
	if len(orders) != len(c.Nodes) {
		t.Fatalf("no order of %s0..99 on every master: %v", prefix, orders)
	}
	return orders
}

// The job path on a 3-master Redis Cluster, with the built worker binary and
// asynq's own cluster client: three hot orders whose locks live on three
// different masters, each held with five waiters parked behind it, are seen
// by `lockstep locks` and the page (the waiters in arrival order, in the
// state asynq's Inspector reports), then handed on in arrival order, each
// task run to ok once under a rising fence, and asynq's Inspector reports
// each completed, once, unretried, no earlier than the run ended. A worker
// SIGKILLed in a locked job: the job runs again on the other worker within
// the TTL + 3 s (G7), under a higher fence, without using a retry.
func TestJobsOnCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	client := c.Client()
	ctx := context.Background()
	env := clusterEnv(c)
	opt := asynq.RedisClusterClientOpt{Addrs: c.Addrs()}
	enq, insp := asynq.NewClient(opt), asynq.NewInspector(opt)
	t.Cleanup(func() { _ = enq.Close(); _ = insp.Close() })
	enqueue := func(id, order string, workMS int) {
		t.Helper()
		payload := fmt.Sprintf(`{"order_id":%q,"work_ms":%d}`, order, workMS)
		if _, err := enq.Enqueue(asynq.NewTask(demo.Type, []byte(payload)), asynq.TaskID(id),
			asynq.MaxRetry(5), asynq.Retention(time.Hour), asynq.Queue(demo.Queue)); err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
	}
	state := func(id string) (*asynq.TaskInfo, bool) {
		info, err := insp.GetTaskInfo(demo.Queue, id)
		return info, err == nil
	}
	waitState := func(id string, want asynq.TaskState, timeout time.Duration) {
		t.Helper()
		waitFor(t, timeout, id+" "+want.String(), func() bool { info, ok := state(id); return ok && info.State == want })
	}
	cfg := proctest.WriteFile(t, "worker.yaml", clusterWorkerYAML)
	workers := []*proctest.Proc{startProc(t, "worker", env, "--config", cfg), startProc(t, "worker", env, "--config", cfg)}

	// Three hot orders, on three masters: each held, five waiters parked
	// behind it in their arrival order.
	orders := ordersOnEveryMaster(t, c, "hot")
	const waiting = 5
	parked := map[string][]string{} // order -> its waiters, in arrival order
	for _, o := range orders {
		enqueue("hold-"+o, o, 3000)
	}
	for _, o := range orders {
		waitState("hold-"+o, asynq.TaskStateActive, 20*time.Second)
	}
	for _, o := range orders {
		for i := range waiting {
			parked[o] = append(parked[o], fmt.Sprintf("%s-w%d", o, i))
		}
	}
	var wg sync.WaitGroup
	for _, o := range orders {
		wg.Add(1)
		go func() { // the orders park at once; each order's waiters one after another
			defer wg.Done()
			for _, id := range parked[o] {
				enqueue(id, o, 20)
				waitFor(t, 10*time.Second, id+" parked", func() bool { info, ok := state(id); return ok && info.State == asynq.TaskStateRetry })
			}
		}()
	}
	wg.Wait()
	for _, o := range orders {
		if info, _ := state("hold-" + o); info.State != asynq.TaskStateActive {
			t.Fatalf("hold-%s no longer running with its waiters parked (%v): make it work longer", o, info.State)
		}
	}

	// What the operator sees, while held, through the CLI and the page.
	var cliLocks []lockView
	if r := cliEnv(t, env, "", "locks", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &cliLocks) != nil {
		t.Fatalf("locks --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	base := startUIEnv(t, env)
	var pageLocks []lockView
	getJSON(t, base+"/api/locks", 200, &pageLocks)
	var o overview
	getJSON(t, base+"/api/overview", 200, &o)
	if o.LocksError != "" || o.LossesError != "" {
		t.Errorf("/api/overview: locks error %q, losses error %q", o.LocksError, o.LossesError)
	}
	holderFence := map[string]int64{}
	for what, ls := range map[string][]lockView{"lockstep locks": cliLocks, "/api/locks": pageLocks, "/api/overview": o.Locks} {
		by := map[string]lockView{}
		for _, l := range ls {
			by[l.Resource] = l
		}
		for _, ord := range orders {
			l := by[demo.Resource(ord)]
			if l.TaskID != "hold-"+ord || l.Type != demo.Type || l.Fence <= 0 || l.Waiters != waiting || l.Holder == "" || l.Backend != "redis" {
				t.Errorf("%s: %s = %+v, want held by hold-%s with %d waiters", what, demo.Resource(ord), l, ord, waiting)
			}
			if f, ok := holderFence[ord]; ok && f != l.Fence {
				t.Errorf("%s: %s fence %d, another view %d", what, demo.Resource(ord), l.Fence, f)
			}
			holderFence[ord] = l.Fence
		}
	}
	for _, ord := range orders {
		var ws []waiterView
		getJSON(t, base+"/api/waiters?resource="+demo.Resource(ord), 200, &ws)
		var got []string
		for _, w := range ws {
			got = append(got, w.TaskID)
			info, _ := state(w.TaskID)
			if w.Kind != "task" || w.Queue != demo.Queue || w.State != "retry" || info == nil || info.State != asynq.TaskStateRetry {
				t.Errorf("/api/waiters: %+v; asynq's Inspector: %v", w, info)
			}
		}
		if !slices.Equal(got, parked[ord]) {
			t.Errorf("/api/waiters?resource=%s: %v, want the arrival order %v", demo.Resource(ord), got, parked[ord])
		}
		if !slices.Equal(taskIDsOf(o.Waiters[demo.Resource(ord)]), parked[ord]) {
			t.Errorf("/api/overview waiters of %s: %v, want %v", demo.Resource(ord), taskIDsOf(o.Waiters[demo.Resource(ord)]), parked[ord])
		}
	}
	var task taskView
	getJSON(t, base+"/api/tasks/hold-"+orders[0], 200, &task)
	if task.State != "active" || task.Queue != demo.Queue || task.Type != demo.Type {
		t.Errorf("/api/tasks/hold-%s = %+v, want active", orders[0], task)
	}

	// The release hands each order on, in arrival order.
	var all []string
	for _, ord := range orders {
		all = append(all, "hold-"+ord)
		all = append(all, parked[ord]...)
	}
	for _, id := range all {
		waitState(id, asynq.TaskStateCompleted, 30*time.Second)
	}
	execs, err := demo.ReadExecutions(ctx, client, lock.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	byOrder := checkClusterHistory(t, client, insp, execs, all)
	for _, ord := range orders {
		want := append([]string{"hold-" + ord}, parked[ord]...)
		var got []string
		for _, x := range byOrder[ord] {
			got = append(got, x.TaskID)
		}
		if !slices.Equal(got, want) {
			t.Errorf("order %s ran to ok in the order %v, want the arrival order %v", ord, got, want)
		}
		if x := byOrder[ord]; len(x) > 0 && x[0].Fence != holderFence[ord] {
			t.Errorf("order %s: the holder ran with fence %d, lockstep locks showed %d", ord, x[0].Fence, holderFence[ord])
		}
	}

	// A worker SIGKILLed in a locked job.
	rec := ordersOnEveryMaster(t, c, "rec")[1]
	enqueue("long", rec, 4000)
	waitState("long", asynq.TaskStateActive, 20*time.Second)
	var held lockView
	waitFor(t, 10*time.Second, "long holding its lock", func() bool {
		l := lockOfEnv(t, env, demo.Resource(rec))
		if l != nil {
			held = *l
		}
		return l != nil && l.TaskID == "long"
	})
	var victim, other *proctest.Proc
	for i, w := range workers {
		if procid.Of(w.Pid()) == held.Holder {
			victim, other = w, workers[1-i]
		}
	}
	if victim == nil {
		t.Fatalf("long is held by %s, not one of the workers", held.Holder)
	}
	expires := client.PTTL(ctx, lock.DefaultPrefix+"{"+demo.Resource(rec)+"}").Val()
	victim.Kill()
	killed := time.Now()
	var again demo.Execution
	waitFor(t, 20*time.Second, "long run again", func() bool {
		xs, _ := demo.ReadExecutions(ctx, client, lock.DefaultPrefix)
		for _, x := range xs {
			if x.TaskID == "long" && x.Fence > held.Fence {
				again = x
				return true
			}
		}
		return false
	})
	d := time.UnixMilli(again.StartedMS).Sub(killed)
	t.Logf("long ran again %v after its worker was killed (lock TTL %v, %v left at the kill)", d.Round(time.Millisecond), clusterTTL, expires)
	if d < expires-50*time.Millisecond {
		t.Errorf("long ran again %v after the kill, before the dead run's lock could have expired (%v)", d, expires)
	}
	if d > clusterTTL+3*time.Second {
		t.Errorf("long ran again %v after the kill, want within the TTL (%v) + 3s", d, clusterTTL)
	}
	if again.Worker != procid.Of(other.Pid()) {
		t.Errorf("long ran again on %s, want the live worker %s", again.Worker, procid.Of(other.Pid()))
	}
	waitState("long", asynq.TaskStateCompleted, 20*time.Second)
	execs, err = demo.ReadExecutions(ctx, client, lock.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	checkClusterHistory(t, client, insp, execs, append(all, "long"))
}

func taskIDsOf(ws []waiterView) []string {
	var ids []string
	for _, w := range ws {
		ids = append(ids, w.TaskID)
	}
	return ids
}

// lockOfEnv is lockOf for the Redis that env points at.
func lockOfEnv(t *testing.T, env []string, resource string) *lockView {
	t.Helper()
	r := cliEnv(t, env, "", "locks", "--json")
	var ls []lockView
	if r.code > 1 || json.Unmarshal([]byte(r.stdout), &ls) != nil {
		t.Fatalf("lockstep locks --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, l := range ls {
		if l.Resource == resource {
			return &l
		}
	}
	return nil
}

// checkClusterHistory checks the demo's history against the fenced stores
// and asynq's Inspector: every task of ids ran to ok exactly once, no two ok
// runs of an order overlapped and their fences rose in start order, each
// order's fenced store holds its last run's fence and one write per ok run,
// and asynq reports each task completed, unretried (a parked task keeps
// its contention as last error), no earlier than its run
// ended (asynq keeps whole seconds) and within a few seconds of it, with no
// task failed. It returns the ok runs by order, in start order.
func checkClusterHistory(t *testing.T, client redis.UniversalClient, insp *asynq.Inspector, execs []demo.Execution, ids []string) map[string][]demo.Execution {
	t.Helper()
	ctx := context.Background()
	var oks []demo.Execution
	ran := map[string]demo.Execution{}
	for _, x := range execs {
		if x.Outcome == demo.OutcomeOK {
			oks = append(oks, x)
			ran[x.TaskID] = x
		}
	}
	for _, err := range demo.Overlaps(oks) {
		t.Error(err)
	}
	for id, n := range demo.CompletedTwice(execs) {
		t.Errorf("task %s ran to ok %d times", id, n)
	}
	byOrder := demo.ByOrder(oks)
	for ord, xs := range byOrder {
		h, err := client.HGetAll(ctx, demo.Store(lock.DefaultPrefix, ord)).Result()
		if err != nil {
			t.Fatal(err)
		}
		last := xs[len(xs)-1]
		if h["fence"] != strconv.FormatInt(last.Fence, 10) || h["task_id"] != last.TaskID || h["writes"] != strconv.Itoa(len(xs)) {
			t.Errorf("order %s: fenced store %v, want fence %d of %s and %d writes", ord, h, last.Fence, last.TaskID, len(xs))
		}
	}
	for _, id := range ids {
		x, ok := ran[id]
		if !ok {
			t.Errorf("task %s never ran to ok", id)
			continue
		}
		info, err := insp.GetTaskInfo(demo.Queue, id)
		if err != nil {
			t.Errorf("asynq's Inspector on %s: %v", id, err)
			continue
		}
		finished := time.UnixMilli(x.FinishedMS)
		if info.State != asynq.TaskStateCompleted || info.Retried != 0 ||
			info.CompletedAt.Before(finished.Truncate(time.Second)) || info.CompletedAt.After(finished.Add(5*time.Second)) {
			t.Errorf("asynq's Inspector: %s %v retried %d, completed at %v; its run (fence %d) ended at %v",
				id, info.State, info.Retried, info.CompletedAt, x.Fence, finished.Format(time.RFC3339Nano))
		}
	}
	q, err := insp.GetQueueInfo(demo.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if q.Failed != 0 || q.Archived != 0 || q.Completed != len(ids) {
		t.Errorf("asynq's Inspector: queue %s: %d completed, %d failed, %d archived; want %d, 0, 0", demo.Queue, q.Completed, q.Failed, q.Archived, len(ids))
	}
	return byOrder
}
