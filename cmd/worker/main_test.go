package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/worker"
)

// The binary's fx graph is complete with the example configuration.
func TestValidateApp(t *testing.T) {
	t.Parallel()
	if err := worker.Check([]string{"--config", "../../configs/worker.yaml"}); err != nil {
		t.Fatal(err)
	}
}

// Three worker processes run 600 demo jobs over 12 orders: each job ends ok
// exactly once, no two executions of an order overlap, fences per order
// increase, and contention never used a job's retries.
func TestThreeWorkersRunEveryJobOnce(t *testing.T) {
	t.Parallel()
	const jobsN, orders, maxRetry = 600, 12, 2
	r := newRig(t, redistest.Start(t), testYAML)
	for range 3 {
		// 24 handlers for 12 orders: at least half of them meet a busy lock.
		r.start(bins["worker"], []string{"LOCKSTEP_WORKER_CONCURRENCY=8"})
	}

	// Orders in a shuffled sequence, so neighbours in the queue often share one.
	perOrder := map[string]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i, k := range rng.Perm(jobsN) {
		order := strconv.Itoa(k % orders)
		perOrder[order]++
		r.enqueueDemo(fmt.Sprintf("job-%03d", i), order, 5, asynq.MaxRetry(maxRetry))
	}
	r.waitCompleted(jobsN, 150*time.Second)

	execs := readExecutions(t, r.admin)
	byOrder := checkExecutions(t, execs)
	okByTask := map[string]int{}
	for _, x := range execs {
		if x.Outcome == demo.OutcomeOK {
			okByTask[x.TaskID]++
		}
	}
	for i := range jobsN {
		if id := fmt.Sprintf("job-%03d", i); okByTask[id] != 1 {
			t.Errorf("task %s ran to ok %d times, want exactly once", id, okByTask[id])
		}
	}
	failedRuns := map[string]int{}
	for order, xs := range byOrder {
		ok := 0
		for _, x := range xs {
			if x.Outcome == demo.OutcomeOK {
				ok++
			} else {
				failedRuns[order]++
			}
		}
		if ok != perOrder[order] {
			t.Errorf("order %s: %d ok executions, want one per job: %d", order, ok, perOrder[order])
		}
	}

	// Each task completed once (asynq), and the ok executions per order
	// match the jobs per order: together, every job ran ok exactly once.
	// Retries: only real failures (an execution that did not end ok) may
	// have grown a task's retry count, never contention.
	tasks, err := r.insp.ListCompletedTasks(demo.Queue, asynq.PageSize(jobsN+1))
	if err != nil || len(tasks) != jobsN {
		t.Fatalf("completed tasks: %d, %v", len(tasks), err)
	}
	retried := map[string]int{}
	contended := 0
	busy := regexp.MustCompile(`lock "[^"]+" busy`)
	for _, task := range tasks {
		var p demo.Payload
		_ = json.Unmarshal(task.Payload, &p)
		retried[p.OrderID] += task.Retried
		if busy.MatchString(task.LastErr) {
			contended++
		}
	}
	for order := range perOrder {
		if retried[order] != failedRuns[order] {
			t.Errorf("order %s: tasks retried %d times in all, but only %d executions failed", order, retried[order], failedRuns[order])
		}
	}
	// With the hand-off a waiting job usually contends once, then runs when
	// handed the lock; internal/jobs' TestContentionDoesNotUseRetries shows
	// more contentions than retries.
	t.Logf("%d of %d jobs met a busy lock (max retry %d); %d failed executions",
		contended, jobsN, maxRetry, sum(failedRuns))
	if contended < jobsN/10 {
		t.Errorf("only %d of %d jobs met a busy lock: the test did not show contention spares the budget", contended, jobsN)
	}
}

// SIGKILL a worker in the middle of a job while it takes others: its lock
// frees within one TTL, the order is taken again with a higher fence; every
// task asynq still had active for it (running under its lock, or without it:
// waiting in it, just dequeued, on its way back to asynq, parked by it while
// a release handed the lock on to it) is brought back by a live worker
// within the recovery bound, a locked one runs again within it; every job
// completes, each once, and none waits for asynq's own lease.
func TestKilledWorkersJobsStillComplete(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	workers := []*proc{r.worker(), r.worker(), r.worker()}
	admin := r.admin
	ctx := context.Background()

	const victimWork = 4 * time.Second
	r.enqueueDemo("victim", "kill", int(victimWork.Milliseconds()))
	// Which worker took it: the one that logs its start.
	victim, rec := whoLogged(t, workers, "job started", "victim")
	fence := fenceOf(rec)
	ids := []string{"victim"}
	for i := range 5 {
		ids = append(ids, fmt.Sprintf("follow-%d", i))
		r.enqueueDemo(ids[len(ids)-1], "kill", 5)
	}
	for i := range 120 {
		ids = append(ids, fmt.Sprintf("job-%03d", i))
		r.enqueueDemo(ids[len(ids)-1], strconv.Itoa(i%6), 5)
	}
	total := len(ids)

	lockKey := "lockstep:{lock:order:kill}"
	token := admin.Get(ctx, lockKey).Val()
	victimID := ":" + strconv.Itoa(victim.Pid())
	victimProc := procid.Of(victim.Pid())
	killed := time.Now()
	victim.Kill()
	// What asynq has active for the killed worker now (its last dequeue of
	// the task was the killed worker's, as asynqstore.Holds reads it) stays
	// so until a live worker recovers it: three missed beats away.
	tasks := make([]asynqstore.Task, len(ids))
	for i, id := range ids {
		tasks[i] = asynqstore.Task{Queue: demo.Queue, ID: id}
	}
	held, err := asynqstore.New(admin).Holds(ctx, tasks)
	if err != nil {
		t.Fatal(err)
	}
	var active []string
	for i, h := range held {
		if h.Active && h.By == victimProc {
			active = append(active, ids[i])
		}
	}
	waitFor(t, 5*time.Second, "the killed worker's lock to free", func() bool {
		return admin.Get(ctx, lockKey).Val() != token
	})
	freed := time.Since(killed)
	if freed > testTTL+50*time.Millisecond {
		t.Errorf("the killed worker's lock freed %v after the kill, want within one TTL (%v)", freed, testTTL)
	}
	var next execution
	waitFor(t, 20*time.Second, "order kill to run again", func() bool {
		for _, x := range readExecutions(t, admin) {
			if x.OrderID == "kill" && x.StartedMS >= killed.UnixMilli() {
				next = x
				return true
			}
		}
		return false
	})
	if next.Fence <= fence {
		t.Fatalf("order kill ran again with fence %d, not above the killed holder's %d", next.Fence, fence)
	}
	t.Logf("killed holder's lock freed %v after SIGKILL (TTL %v); order taken again %dms after the kill with fence %d > %d",
		freed.Round(time.Millisecond), testTTL, next.StartedMS-killed.UnixMilli(), next.Fence, fence)

	// Each comes back by a live worker's recovery within recoveryBound (not
	// by asynq's lease: 30 s, then its recoverer's minute); a locked one
	// (its lock expired) runs again within it too (it goes first in its
	// order's queue).
	recovered := map[string]string{
		"dead worker's task recovered: it held no lock; back at the head of its queue":  "without its lock",
		"dead worker's task recovered: its lock expired; back at the head of its queue": "locked",
	}
	states := map[string]int{}
	locked := map[string]bool{}
	for _, id := range active {
		var at time.Time
		var state string
		if !redistest.Within(recoveryBound+5*time.Second, 20*time.Millisecond, func() bool {
			for _, w := range workers {
				if w == victim {
					continue
				}
				for msg, s := range recovered {
					if rec := w.findLog(proctest.Msg(msg, "id", id)); rec != nil {
						at, _ = time.Parse(time.RFC3339Nano, rec["time"].(string))
						state = s
						return true
					}
				}
			}
			return false
		}) {
			state := "gone"
			if info, err := r.insp.GetTaskInfo(demo.Queue, id); err == nil {
				state = info.State.String()
			}
			t.Errorf("task %s, active for the killed worker, not recovered %v after the kill: asynq has it %s", id, recoveryBound+5*time.Second, state)
			continue
		}
		states[state]++
		locked[id] = state == "locked"
		if d := at.Sub(killed); d > recoveryBound {
			t.Errorf("task %s (%s on the killed worker) recovered %v after the kill, want within %v", id, state, d, recoveryBound)
		}
	}
	if states["locked"] == 0 {
		t.Errorf("asynq had none of the killed worker's locked tasks active (%q); it was running victim", active)
	}
	// Every job then completes in the time the rest takes: the victim's
	// run again (its work, once its lock is free) after the recoveries,
	// with a margin for a loaded machine (measured: 5-6 s after the kill).
	// A task left to asynq's lease would take 30 s and more.
	completeBound := recoveryBound + victimWork + 5*time.Second
	if !redistest.Within(completeBound-time.Since(killed), 100*time.Millisecond, func() bool {
		q, err := r.insp.GetQueueInfo(demo.Queue)
		return err == nil && q.Completed == total
	}) {
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){r.insp.ListActiveTasks, r.insp.ListRetryTasks, r.insp.ListPendingTasks} {
			infos, _ := list(demo.Queue)
			for _, info := range infos {
				t.Errorf("%v after the kill, %s is %v (retried %d, last error %q): left to asynq's lease; asynq had it active for the killed worker: %v",
					completeBound, info.ID, info.State, info.Retried, info.LastErr, slices.Contains(active, info.ID))
			}
		}
		t.FailNow()
	}
	t.Logf("all %d jobs completed %v after the kill; the killed worker had %v active", total, time.Since(killed).Round(time.Millisecond), states)
	for id, isLocked := range locked {
		if !isLocked {
			continue
		}
		for _, x := range readExecutions(t, admin) {
			if x.TaskID == id && x.StartedMS >= killed.UnixMilli() {
				if d := time.UnixMilli(x.StartedMS).Sub(killed); d > recoveryBound {
					t.Errorf("locked task %s ran again %v after the kill, want within %v", id, d, recoveryBound)
				}
				break
			}
		}
	}

	// Every task ran to ok. asynq delivers at least once: a task that the
	// killed worker finished (and recorded) but had not yet acknowledged runs
	// again; only such tasks may show a second ok.
	execs := readExecutions(t, admin)
	checkExecutions(t, execs)
	oks := map[string][]execution{}
	for _, x := range execs {
		if x.Outcome == demo.OutcomeOK {
			oks[x.TaskID] = append(oks[x.TaskID], x)
		}
	}
	if len(oks) != total {
		t.Errorf("%d tasks ran to ok, want all %d", len(oks), total)
	}
	for task, xs := range oks {
		if len(xs) > 1 && (len(xs) > 2 || !strings.HasSuffix(xs[0].Worker, victimID)) {
			t.Errorf("task %s ran to ok %d times, first on %s: only a task the killed worker (%s) had finished may run again",
				task, len(xs), xs[0].Worker, victimID)
		}
	}
}

// waitRun is one run of test:wait, from the stream test:waiter:runs.
type waitRun struct {
	id         string
	fence      int64
	start, end int64 // Unix ms; end 0 when the run never ended
}

func readWaitRuns(t *testing.T, c *redis.Client) []waitRun {
	t.Helper()
	msgs, err := c.XRange(context.Background(), "test:waiter:runs", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byRun := map[string]*waitRun{}
	var order []string
	for _, m := range msgs {
		id, _ := m.Values["task_id"].(string)
		fence, _ := strconv.ParseInt(m.Values["fence"].(string), 10, 64)
		at, _ := strconv.ParseInt(m.Values["at_ms"].(string), 10, 64)
		k := id + "/" + strconv.FormatInt(fence, 10)
		r := byRun[k]
		if r == nil {
			r = &waitRun{id: id, fence: fence}
			byRun[k] = r
			order = append(order, k)
		}
		if m.Values["event"] == "start" {
			r.start = at
		} else {
			r.end = at
		}
	}
	runs := make([]waitRun, 0, len(order))
	for _, k := range order {
		runs = append(runs, *byRun[k])
	}
	return runs
}

// waitsInWorker reports whether task id waits for its lock (test:wait's,
// lock:wait:k) in a worker: the Wait policy waits in the resource's one
// queue as a caller whose token names the task.
func waitsInWorker(c *redis.Client, id string) bool {
	ws, err := lock.New(c).Waiters(context.Background(), "lock:wait:k")
	for _, w := range ws {
		if err == nil && w.Live && w.Caller.TaskID == id {
			return true
		}
	}
	return false
}

// The worker of a task that waits for its lock in the worker (Wait policy),
// first in line, is SIGKILLed. The holder's release hands the lock to that
// dead waiter; the grant expires within the lock's TTL and the next waiter,
// waiting in another worker, takes it then: the resource stalls no longer
// than the TTL. The dead waiter's task comes back within its worker's
// missed beats (not after asynq's lease) and runs once. No two runs
// overlap, fences increase, and every task runs to its end exactly once.
func TestKilledFirstWaiterStallsNoLongerThanTheTTL(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), strings.Replace(testYAML, "concurrency: 4", "concurrency: 1", 1))
	ignorer := func() *proc { return r.start(bins["ignorer"], nil) }
	workers := []*proc{ignorer(), ignorer(), ignorer()}
	admin := r.admin
	enqueue := func(id string, workMS int) { t.Helper(); r.enqueueTest("test:wait", id, workMS) }

	enqueue("holder", 2500)
	holder, _ := whoLogged(t, workers, "job started", "holder")
	enqueue("first", 300)
	victim, _ := whoLogged(t, workers, "lock busy; task waits in the worker", "first")
	waitFor(t, 10*time.Second, "first waiting in its worker", func() bool { return waitsInWorker(admin, "first") })
	enqueue("second", 300)
	waitFor(t, 10*time.Second, "second waiting in its worker", func() bool { return waitsInWorker(admin, "second") })
	if victim == holder {
		t.Fatal("the holder's worker took the waiter too: concurrency is not 1")
	}
	victim.Kill()
	killed := time.Now()
	if runs := readWaitRuns(t, admin); len(runs) != 1 || runs[0].end != 0 {
		t.Fatalf("runs before the holder ended: %+v, want the holder's alone, still running", runs)
	}

	r.waitTask("default", "second", asynq.TaskStateCompleted, 20*time.Second)
	runs := readWaitRuns(t, admin)
	if len(runs) < 2 || runs[0].id != "holder" || runs[1].id != "second" {
		t.Fatalf("runs %+v, want holder then second (then the recovered first)", runs)
	}
	stall := time.Duration(runs[1].start-runs[0].end) * time.Millisecond
	// The grant to the dead waiter lasts one TTL; then the waiter's backoff
	// (contention_backoff_max 200ms) and a little.
	if stall > testTTL+time.Second {
		t.Errorf("second started %v after the holder ended, want within the TTL (%v) and its backoff", stall, testTTL)
	}
	t.Logf("first waiter's worker killed: the resource was idle %v between the holder and the next waiter (TTL %v)", stall, testTTL)

	// "first", active on the dead worker while it waited there without the
	// lock, is brought back by a live worker as soon as the dead one's beats
	// are overdue (its bare record), not after asynq's lease.
	rescuer, _ := whoLogged(t, workers, "dead worker's task recovered: it held no lock; back at the head of its queue", "first")
	if rescuer == victim {
		t.Fatal("the killed worker logged a recovery")
	}
	if d := time.Since(killed); d > recoveryBound {
		t.Errorf("first recovered %v after its worker was killed, want within %v (three missed beats and a look)", d, recoveryBound)
	}
	r.waitTask("default", "first", asynq.TaskStateCompleted, 20*time.Second)

	runs = readWaitRuns(t, admin)
	var ids []string
	for i, run := range runs {
		ids = append(ids, run.id)
		if run.end == 0 {
			t.Errorf("run %+v never ended", run)
		}
		if i > 0 && (run.start < runs[i-1].end || run.fence <= runs[i-1].fence) {
			t.Errorf("run %+v overlaps or does not follow %+v", run, runs[i-1])
		}
	}
	if want := []string{"holder", "second", "first"}; !slices.Equal(ids, want) {
		t.Errorf("ran %v, want %v, each once", ids, want)
	}
}

// Deleting a job's lock key from outside ends that execution as lock_lost
// within one renewal interval, and the job runs again.
func TestDeletedLockEndsExecution(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	w := r.worker()

	r.enqueueDemo("d1", "del", 1500)
	fence := w.started("d1", 10*time.Second)
	deleted := time.Now()
	if err := r.admin.Del(context.Background(), "lockstep:{lock:order:del}").Err(); err != nil {
		t.Fatal(err)
	}
	lost := r.ended(fence, 20*time.Second)
	waitFor(t, 20*time.Second, "the execution to run again", func() bool {
		return slices.ContainsFunc(readExecutions(t, r.admin), func(x execution) bool {
			return x.Fence > fence && x.Outcome == demo.OutcomeOK
		})
	})
	if lost.Outcome != demo.OutcomeLockLost {
		t.Fatalf("execution with fence %d ended %q, want lock_lost", fence, lost.Outcome)
	}
	if d := time.Duration(lost.FinishedMS-deleted.UnixMilli()) * time.Millisecond; d > testRenewInterval+50*time.Millisecond {
		t.Errorf("execution ended %v after its key was deleted, want within one renewal interval (%v)", d, testRenewInterval)
	}
	r.waitCompleted(1, 10*time.Second)
	if info, err := r.insp.GetTaskInfo(demo.Queue, "d1"); err != nil || info.Retried != 1 {
		t.Fatalf("task d1: %v, %v; want retried once", info, err)
	}
}

// SIGTERM: the worker stops taking tasks, lets a short handler finish,
// cancels a long one at the shutdown timeout (its task goes back to the
// queue), releases every lock and exits 0 within the shutdown timeout. A
// slot running a handed-on task gives asynq the result of the task it was
// delivered, which finished: asynq completes it, not pushes it back. The
// HTTP endpoints answer until then. On the way: Redis with a password read
// from a file, which appears in no log line and no metric, and --http-addr
// winning over LOCKSTEP_HTTP_ADDR.
func TestSIGTERMDrainsAndReleases(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-Pa55word"
	rs := redistest.Start(t)
	if err := rs.Client().ConfigSet(context.Background(), "requirepass", secret).Err(); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, rs, testYAML, func(o *redis.Options) { o.Password = secret })
	w := r.start(bins["worker"], []string{
		"LOCKSTEP_REDIS_PASSWORD_FILE=" + writeFile(t, "redis-password", secret+"\n"),
		"LOCKSTEP_HTTP_ADDR=256.0.0.1:9", // cannot listen: the flag must win
	}, "--http-addr", "127.0.0.1:0")

	addr := w.httpAddr()
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/metrics": "lockstep_locks_held"} {
		waitFor(t, 5*time.Second, path, func() bool {
			body, code := get("http://"+addr+path, 2*time.Second)
			return code == http.StatusOK && strings.Contains(body, want)
		})
	}
	if body, _ := get("http://"+addr+"/metrics", 2*time.Second); strings.Contains(body, secret) {
		t.Error("/metrics shows the Redis password")
	}

	r.enqueueDemo("short", "short", 800)
	r.enqueueDemo("long", "long", 60_000)
	w.started("short", 10*time.Second)
	w.started("long", 10*time.Second)
	// A chain: "first" holds order "chain" while "next" parks behind it;
	// first's release hands the lock on to next, which runs in first's slot.
	r.enqueueDemo("first", "chain", 1000)
	w.started("first", 10*time.Second)
	r.enqueueDemo("next", "chain", 60_000)
	w.started("next", 10*time.Second)

	begin := time.Now()
	code, exited := w.Term(testShutdownTimeout + 10*time.Second)
	took := time.Since(begin)
	if !exited || code != 0 {
		t.Fatalf("exit code %d after SIGTERM (exited by itself: %v), want 0", code, exited)
	}
	if took > testShutdownTimeout {
		t.Errorf("exited %v after SIGTERM, want within the shutdown timeout %v", took, testShutdownTimeout)
	}
	if keys := r.admin.Keys(context.Background(), "lockstep:{*}").Val(); len(keys) != 0 {
		t.Fatalf("lock keys left after shutdown: %v", keys)
	}
	if strings.Contains(w.allLogs(), secret) {
		t.Error("the logs show the Redis password")
	}
	outcomes := map[string]string{}
	for _, x := range readExecutions(t, r.admin) {
		outcomes[x.OrderID] = x.Outcome
	}
	if outcomes["short"] != demo.OutcomeOK || outcomes["long"] != demo.OutcomeCanceled {
		t.Fatalf("outcomes %v, want short ok and long canceled", outcomes)
	}
	for _, id := range []string{"long", "next"} {
		if info, err := r.insp.GetTaskInfo(demo.Queue, id); err != nil || info.State != asynq.TaskStatePending || info.Retried != 0 {
			t.Errorf("%s task after shutdown: %+v, %v; want pending again, not retried", id, info, err)
		}
	}
	if info, err := r.insp.GetTaskInfo(demo.Queue, "first"); err == nil && info.State != asynq.TaskStateCompleted {
		t.Errorf("task first, done before the shutdown, is %v after it: asynq pushed it back to its queue", info.State)
	}
	if strings.Contains(w.allLogs(), "Pushed task id=first") {
		t.Errorf("asynq pushed the finished task first back to its queue at shutdown")
	}
}

// A bad configuration exits 2 with one line naming the file, the field and
// the problem.
func TestBadConfigExits2(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		env        []string
		want       []string
	}{
		{"unknown key", "worker:\n  concurency: 3\n", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1"}, []string{"line 2", `unknown field "concurency" in worker`}},
		{"bad duration", "lock:\n  ttl: 5 sec\n", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1"}, []string{"line 2", "lock.ttl", `"5 sec"`}},
		{"fence ttl below its floor", "lock:\n  fence_ttl: 1s\n", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1"}, []string{"line 2", "lock.fence_ttl", "at least 2s", "got 1s"}},
		{"env fence ttl below its floor", "", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1", "LOCKSTEP_LOCK_FENCE_TTL=100ms"}, []string{"LOCKSTEP_LOCK_FENCE_TTL", "at least 2s", "got 100ms"}},
		{"missing redis address", "worker:\n  concurrency: 3\n", nil, []string{"redis.addr", "required"}},
		{"bad env", "worker:\n  concurrency: 3\n", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1", "LOCKSTEP_WORKER_SHUTDOWN_TIMEOUT=soon"}, []string{"LOCKSTEP_WORKER_SHUTDOWN_TIMEOUT", `"soon"`}},
		{"bad tracing env", "worker:\n  concurrency: 3\n", []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1", "OTEL_TRACES_EXPORTER=zipkin"}, []string{"OTEL_TRACES_EXPORTER", `"zipkin"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, "worker.yaml", c.yaml)
			cmd := exec.Command(bins["worker"], "--config", path)
			cmd.Env = c.env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr: %s", err, stderr.String())
			}
			out := stderr.String()
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
				t.Fatalf("stderr is not one line: %q", out)
			}
			if c.env == nil || !strings.Contains(c.want[0], "LOCKSTEP") && !strings.HasPrefix(c.want[0], "OTEL_") {
				c.want = append(c.want, path)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("stderr %q does not mention %q", out, w)
				}
			}
		})
	}
}

// get GETs url with a client timeout and returns the body and status code
// (the error and 0 when there is no answer).
func get(url string, timeout time.Duration) (string, int) {
	resp, err := (&http.Client{Timeout: timeout}).Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error(), 0
	}
	return string(b), resp.StatusCode
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// --help prints the usage and exits 0, as the scheduler does.
func TestHelpExits0(t *testing.T) {
	t.Parallel()
	p := startWorker(t, nil, "--help")
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0; output:\n%s", code, p.allLogs())
	}
	out := p.allLogs()
	for _, w := range []string{"Usage: worker [--config FILE] [--http-addr HOST:PORT]", "-config", "-http-addr"} {
		if !strings.Contains(out, w) {
			t.Errorf("usage %q does not contain %q", out, w)
		}
	}
}
