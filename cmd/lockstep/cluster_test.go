package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	_ "github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	_ "github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/internal/script"
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
// lock expires soon, and 3 s to finish its handlers when stopped; its
// queues follow.
var clusterWorkerYAML = strings.NewReplacer("ttl: 2s", "ttl: 1s", "shutdown_timeout: 1s", "shutdown_timeout: 3s").Replace(workerYAML)

// clusterSchedulerYAML is a scheduler replica for run-time schedules only.
const clusterSchedulerYAML = `
http:
  addr: "127.0.0.1:0"
log:
  level: debug
scheduler:
  max_clock_skew: 200ms
  tick_lock_ttl: 1s
  task_retention: 1h
`

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

// The job path on a 3-master Redis Cluster, with the built binaries and
// asynq's own cluster client, and every script of the project on it:
//   - three hot orders whose locks live on three different masters, each
//     held with five waiters parked behind it, are seen by lockstep locks
//     and the page (the waiters in arrival order, in the retry state asynq's
//     Inspector reports), then handed on in arrival order, each task run to
//     ok once under a rising fence, and asynq's Inspector reports each
//     completed, once, unretried, no earlier than its run ended;
//   - a worker SIGKILLed in a locked job: the job runs again on the other
//     worker within the TTL + 3 s (G7), under a higher fence, unretried;
//   - a worker stopped (SIGTERM) while it holds an order with waiters: the
//     lock is granted to the first waiter, and they run in order elsewhere;
//   - a run-time overlap skip schedule on a second queue (another master
//     than asynq's default), ticking all along, then paused, backfilled,
//     resumed (its paused ticks recorded skipped) and removed;
//   - WithLock, a waiter that gives up, and Allow from code;
//   - then no node has replied CROSSSLOT to anyone, and every script of the
//     project ran on the cluster, but the three a Cluster does not use.
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
	// A second queue, on another master than asynq's {default}, for a
	// run-time schedule (overlap skip) that ticks through the whole test.
	tickQueue := ""
	for i := 0; tickQueue == "" && i < 100; i++ {
		if q := fmt.Sprintf("ticks%d", i); c.NodeFor("asynq:{"+q+"}") != c.NodeFor("asynq:{"+demo.Queue+"}") {
			tickQueue = q
		}
	}
	cfg := proctest.WriteFile(t, "worker.yaml", clusterWorkerYAML+"  queues: {"+demo.Queue+": 1, "+tickQueue+": 1}\n")
	workers := []*proctest.Proc{startProc(t, "worker", env, "--config", cfg), startProc(t, "worker", env, "--config", cfg)}
	schedCfg := proctest.WriteFile(t, "scheduler.yaml", clusterSchedulerYAML)
	startProc(t, "scheduler", env, "--config", schedCfg)
	if r := cliEnv(t, env, "", "schedules", "add", "every", "--cron", "* * * * * *", "--task", demo.Type,
		"--payload", `{"order_id":"tick","work_ms":5}`, "--queue", tickQueue, "--overlap", "skip"); r.code != 0 {
		t.Fatalf("schedules add: exit %d: %s", r.code, r.stderr)
	}
	added := time.Now()

	// Three hot orders, on three masters: each held, five waiters parked
	// behind it in their arrival order.
	orders := ordersOnEveryMaster(t, c, "hot")
	const waiting = 5
	parked := map[string][]string{} // order -> its waiters, in arrival order
	for _, o := range orders {
		enqueue("hold-"+o, o, 6000) // long enough to park 15 waiters in make test (3 s was not once)
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
				waitFor(t, 20*time.Second, id+" parked", func() bool { info, ok := state(id); return ok && info.State == asynq.TaskStateRetry })
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
			// Parked (retry), or back from its parking's fallback to park
			// again (pending, active): with a 1 s TTL a waiter comes back
			// every second or two while its holder lives, and the view and
			// the Inspector read it at different moments.
			info, _ := state(w.TaskID)
			waitingState := func(s string) bool { return s == "retry" || s == "pending" || s == "active" }
			if w.Kind != "task" || w.Queue != demo.Queue || !waitingState(w.State) || info == nil || !waitingState(info.State.String()) {
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

	// A worker stopped (SIGTERM) while it holds a hot order with two
	// waiters parked: its handler finishes, the stopping server cannot run
	// the waiters, so it grants the lock to the first and wakes it; the
	// other worker takes the grant over and the waiters run in order.
	workers = []*proctest.Proc{other, startProc(t, "worker", env, "--config", cfg)}
	stop := ordersOnEveryMaster(t, c, "stop")[2]
	enqueue("stop-hold", stop, 1500)
	waitFor(t, 10*time.Second, "stop-hold holding its lock", func() bool {
		l := lockOfEnv(t, env, demo.Resource(stop))
		if l != nil {
			held = *l
		}
		return l != nil && l.TaskID == "stop-hold"
	})
	stopped := slices.IndexFunc(workers, func(w *proctest.Proc) bool { return procid.Of(w.Pid()) == held.Holder })
	if stopped < 0 {
		t.Fatalf("stop-hold is held by %s, not one of the workers", held.Holder)
	}
	stopWaiters := []string{"stop-w0", "stop-w1"}
	for _, id := range stopWaiters {
		enqueue(id, stop, 20)
		waitState(id, asynq.TaskStateRetry, 10*time.Second)
	}
	if code, exited := workers[stopped].Term(10 * time.Second); !exited || code != 0 {
		t.Fatalf("worker stopped with SIGTERM: exit %d (exited: %v), want 0", code, exited)
	}
	for _, id := range stopWaiters {
		waitState(id, asynq.TaskStateCompleted, 20*time.Second)
	}
	all = append(all, "long", "stop-hold")
	all = append(all, stopWaiters...)
	execs, err = demo.ReadExecutions(ctx, client, lock.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	byOrder = checkClusterHistory(t, client, insp, execs, all)
	if got := taskIDsOfRuns(byOrder[stop]); !slices.Equal(got, append([]string{"stop-hold"}, stopWaiters...)) {
		t.Errorf("order %s ran to ok in the order %v, want stop-hold, then its waiters in arrival order", stop, got)
	}

	// The run-time schedule: paused, backfilled, resumed (the ticks due
	// while paused recorded skipped), removed.
	if r := cliEnv(t, env, "", "schedules", "pause", "every"); r.code != 0 {
		t.Fatalf("schedules pause: exit %d: %s", r.code, r.stderr)
	}
	paused := time.Now()
	from := added.Truncate(time.Second).Add(-5 * time.Second)
	r := cliEnv(t, env, "", "--config", schedCfg, "schedules", "backfill", "every", "--from", rfc(from), "--to", rfc(from), "--json")
	var bf []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &bf) != nil || len(bf) != 1 || bf[0]["result"] != "enqueued" {
		t.Fatalf("backfill of a paused schedule: exit %d, %s%s; want its one tick enqueued", r.code, r.stdout, r.stderr)
	}
	waitFor(t, 20*time.Second, "the backfilled tick run", func() bool {
		info, err := insp.GetTaskInfo(tickQueue, fmt.Sprintf("every:%d", from.Unix()))
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	// Ticks fall due while the schedule is paused (the latest one or two
	// are still taken at the resume, late).
	waitFor(t, 5*time.Second, "ticks due while paused", func() bool { return time.Now().After(paused.Truncate(time.Second).Add(4 * time.Second)) })
	if r := cliEnv(t, env, "", "schedules", "resume", "every"); r.code != 0 {
		t.Fatalf("schedules resume: exit %d: %s", r.code, r.stderr)
	}
	var ticks result
	defer func() {
		if t.Failed() {
			t.Logf("lockstep ticks every: exit %d\n%s%s", ticks.code, ticks.stdout, ticks.stderr)
		}
	}()
	redistest.WaitEvery(t, 10*time.Second, 100*time.Millisecond, "ticks skipped with reason paused, and ticks done", func() bool {
		ticks = cliEnv(t, env, "", "ticks", "every", "--last", "50", "--json")
		return ticks.code == 0 && strings.Contains(ticks.stdout, `"reason": "paused"`) && strings.Contains(ticks.stdout, `"state": "done"`)
	})
	if q, err := insp.GetQueueInfo(tickQueue); err != nil || q.Completed < 2 || q.Failed != 0 {
		t.Errorf("asynq's Inspector: queue %s: %+v, %v; want the schedule's runs completed, none failed", tickQueue, q, err)
	}
	if r := cliEnv(t, env, "", "schedules", "rm", "every"); r.code != 0 {
		t.Fatalf("schedules rm: exit %d: %s", r.code, r.stderr)
	}

	// A rate-limited demo job over its burst is delayed to its turn
	// (rate.lua with its turn key), on the rate key's master, and completes unretried.
	calls := []string{"call-0", "call-1", "call-2"} // the third is over the burst of 2
	for _, id := range calls {
		payload := `{"client_id":"cluster","work_ms":1}`
		if _, err := enq.Enqueue(asynq.NewTask(demo.RatedType, []byte(payload)), asynq.TaskID(id),
			asynq.Retention(time.Hour), asynq.Queue(demo.Queue)); err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
	}
	for _, id := range calls {
		waitState(id, asynq.TaskStateCompleted, 20*time.Second)
		if info, _ := state(id); info.Retried != 0 {
			t.Errorf("%s used %d retries; a rate delay is no failure", id, info.Retried)
		}
	}

	// Code of one's own locks and rates on the Cluster: WithLock, a
	// waiter that gives up, Allow.
	l := lockstep.NewLocker(client)
	defer l.Close(ctx)
	err = l.WithLock(ctx, "report:cluster", func(ctx context.Context, lease *lockstep.Lease) error {
		return l.WithLock(ctx, "report:cluster", func(context.Context, *lockstep.Lease) error { return nil }, lockstep.Wait(100*time.Millisecond))
	})
	if !errors.Is(err, lockstep.ErrNotAcquired) {
		t.Errorf("WithLock inside a WithLock of another owner, waiting 100ms: %v, want ErrNotAcquired", err)
	}
	if wait, err := l.Allow(ctx, "api:cluster", lockstep.RateLimit{N: 1, Per: time.Hour}); wait != 0 || err != nil {
		t.Errorf("Allow: %v, %v; want admitted", wait, err)
	}

	// A fair share's decision (fair.lua, in its scope's slot) and its park
	// (park.lua, in the queue's): a task seen waits, parked, then started.
	fenq := "fair:cluster"
	if _, err := enq.Enqueue(asynq.NewTask("fair:test", []byte(`{}`)), asynq.TaskID(fenq), asynq.Queue("fairq")); err != nil {
		t.Fatal(err)
	}
	scope := lock.FairScope("fairq", "fair:test")
	f, err := lock.New(client).Fair(ctx, scope, lock.FairAsk{Seen: []lock.FairTask{{ID: fenq, Tenant: "t", Weight: 1}}, TTL: time.Minute})
	if err != nil || len(f.Park) != 1 {
		t.Fatalf("fair on the Cluster: %+v, %v; want the task seen to wait", f, err)
	}
	if moved, err := asynqstore.New(client).Park(ctx, "fairq", f.Park, time.Now().Add(time.Minute)); len(moved) != 1 || err != nil {
		t.Fatalf("park on the Cluster: %v, %v; want the task parked", moved, err)
	}
	if info, err := insp.GetTaskInfo("fairq", fenq); err != nil || info.State != asynq.TaskStateRetry {
		t.Errorf("asynq's Inspector: the parked task %+v, %v; want it in the retry set", info, err)
	}
	if f, err := lock.New(client).Fair(ctx, scope, lock.FairAsk{Release: 1, TTL: time.Minute}); err != nil || len(f.Started) != 1 {
		t.Errorf("fair on the Cluster: %+v, %v; want the task started", f, err)
	}

	// Every script of the program ran on the Cluster, none across slots,
	// except those that a Cluster does not use.
	if n := c.Errors()["CROSSSLOT"]; n != 0 {
		t.Errorf("the cluster's nodes replied CROSSSLOT %d times", n)
	}
	ran, not := c.Scripts()
	if !slices.Equal(not, notOnCluster) {
		t.Errorf("scripts not run on the cluster: %v, want only %v (ran: %v)", not, notOnCluster, ran)
	}
	if files, known := luaFiles(t), slices.Sorted(maps.Keys(script.All())); !slices.Equal(files, known) {
		t.Errorf("the repository's scripts %v, this test knows %v: import the package of each", files, known)
	}
}

// luaFiles names the repository's scripts as script.New does
// (internal/lock/lua/acquire.lua: "lock"+"/acquire.lua"), but for the
// libraries they are prefixed with.
func luaFiles(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("../../internal/*/lua/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		if filepath.Base(p) != "lib.lua" {
			names = append(names, filepath.Base(filepath.Dir(filepath.Dir(p)))+"/"+filepath.Base(p))
		}
	}
	slices.Sort(names)
	return names
}

// notOnCluster are the scripts that a Cluster does not run, whose keys span
// slots: Redlock's (on independent masters) and the renewal of many leases
// in one call (a Cluster renews each with renew.lua). asynq's dequeue runs
// there too, noting the worker in the task without the hold record (a
// Cluster worker writes the record itself: it lies in another slot).
var notOnCluster = []string{"lock/fence_raise.lua", "lock/renew_batch.lua"}

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func taskIDsOfRuns(xs []demo.Execution) []string {
	var ids []string
	for _, x := range xs {
		ids = append(ids, x.TaskID)
	}
	return ids
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
		// An order the schedule still writes (every second) may have a run
		// between the executions' read and the store's: read both again
		// until they agree, for a few of its periods.
		var h map[string]string
		var last demo.Execution
		tries := 0
		redistest.Within(3*time.Second, 100*time.Millisecond, func() bool {
			if tries++; tries > 1 {
				fresh, err := demo.ReadExecutions(ctx, client, lock.DefaultPrefix)
				if err != nil {
					t.Fatal(err)
				}
				xs = demo.ByOrder(okOnly(fresh))[ord]
			}
			var err error
			if h, err = client.HGetAll(ctx, demo.Store(lock.DefaultPrefix, ord)).Result(); err != nil {
				t.Fatal(err)
			}
			last = xs[len(xs)-1]
			return h["fence"] == strconv.FormatInt(last.Fence, 10) && h["task_id"] == last.TaskID && h["writes"] == strconv.Itoa(len(xs))
		})
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

// okOnly returns the executions that ran to ok.
func okOnly(execs []demo.Execution) []demo.Execution {
	var oks []demo.Execution
	for _, x := range execs {
		if x.Outcome == demo.OutcomeOK {
			oks = append(oks, x)
		}
	}
	return oks
}
