package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// order records the order in which handlers start.
type order struct {
	mu  sync.Mutex
	ids []string
}

func (o *order) add(id string) {
	o.mu.Lock()
	o.ids = append(o.ids, id)
	o.mu.Unlock()
}

func (o *order) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ids)
}

// The release hands the lock to the longest waiting task and the releasing
// worker runs it: waiters run in the order they first contended, one at a
// time, each once, at once after each other (no poll: the backoff and the
// poll interval are seconds here), and leave no waiter behind. asynq keeps
// these tasks (a retention), so each keeps its "ok" done marker until it
// expires: a delivery of one of them replays it.
func TestHandoffRunsWaitersInOrder(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Backoff.Min, cfg.Backoff.Max = 3*time.Second, 10*time.Second
	cfg.PollInterval = time.Second
	x := &exclusive{}
	var o order
	release := make(chan struct{})
	spec := lockedSpec("t:hot", "hot", func(ctx context.Context, job Job) error {
		o.add(job.ID)
		if job.ID == "holder" {
			<-release
		}
		return x.run(ctx, 5*time.Millisecond)
	})
	e := newEnv(t, cfg, spec)
	e.addWorker(cfg, spec)
	e.enqueue("t:hot", "holder", nil)
	waitFor(t, 10*time.Second, "holder running", func() bool { return len(o.get()) == 1 })
	const n = 8
	want := []string{"holder"}
	for i := range n {
		id := fmt.Sprintf("w%02d", i)
		want = append(want, id)
		e.enqueue("t:hot", id, nil)
		e.waitState(id, asynq.TaskStateRetry, 10*time.Second) // parked, in this order
	}
	released := time.Now()
	close(release)
	for _, id := range want {
		e.waitState(id, asynq.TaskStateCompleted, 20*time.Second)
	}
	if d := time.Since(released); d > 2*time.Second {
		t.Errorf("%d waiters took %v after the release, want them handed on at once", n, d)
	}
	if got := o.get(); !slices.Equal(got, want) {
		t.Errorf("start order %v, want %v", got, want)
	}
	if x.maxActive.Load() != 1 || x.runs.Load() != n+1 {
		t.Errorf("%d runs, %d at once at most; want %d and 1", x.runs.Load(), x.maxActive.Load(), n+1)
	}
	ctx := context.Background()
	for _, k := range e.admin.Keys(ctx, "lockstep:{hot}:done:*").Val() {
		v, err := e.admin.Get(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			continue // gone since the listing: a beat removes a completed task's marker
		}
		if ttl := e.admin.PTTL(ctx, k).Val(); v != outcomeOK || ttl <= 0 && ttl != -2*time.Nanosecond || ttl > e.srv.markerTTL() {
			t.Errorf("done marker %s = %q, ttl %v; want %q expiring within %v", k, v, ttl, outcomeOK, e.srv.markerTTL())
		}
	}
	if c := e.admin.ZCard(ctx, "lockstep:{hot}:queue").Val(); c != 0 {
		t.Errorf("%d waiters left", c)
	}
	e.wantProcessed("t:hot", ResultSuccess, n+1)
}

// The hold record of each task a chain runs goes once its run has left this
// process's hands (a beat or two after its release): a chain that ran and
// completed its tasks leaves no record behind for a recoverer to find.
func TestChainedTasksLeaveNoHoldRecord(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Backoff.Min, cfg.Backoff.Max = 3*time.Second, 10*time.Second
	cfg.PollInterval = time.Second
	release := make(chan struct{})
	spec := lockedSpec("t:hot", "hot", func(ctx context.Context, job Job) error {
		if job.ID == "holder" {
			<-release
		}
		return nil
	})
	e := newEnv(t, cfg, spec)
	e.enqueue("t:hot", "holder", nil)
	e.waitState("holder", asynq.TaskStateActive, 10*time.Second)
	ids := []string{"holder"}
	for i := range 4 {
		id := fmt.Sprintf("w%d", i)
		ids = append(ids, id)
		e.enqueue("t:hot", id, nil)
		e.waitState(id, asynq.TaskStateRetry, 10*time.Second) // parked: the holder's release hands on to it
	}
	close(release)
	for _, id := range ids {
		e.waitState(id, asynq.TaskStateCompleted, 20*time.Second)
	}
	e.wantProcessed("t:hot", ResultSuccess, float64(len(ids)))
	ctx := context.Background()
	holds := e.srv.recovery.reg.Holds()
	waitFor(t, 10*time.Second, "no hold record left", func() bool { return e.admin.SCard(ctx, holds).Val() == 0 })
}

// A handed-on task that fails is given back to asynq, which retries it as
// a failure (its retry count grows) without running it in between; the
// lock goes on to the next waiter meanwhile.
func TestHandoffFailureIsRetriedByAsynq(t *testing.T) {
	t.Parallel()
	var o order
	var fails atomic.Int32
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		o.add(job.ID)
		switch {
		case job.ID == "holder":
			<-release
		case job.ID == "flaky" && fails.Add(1) == 1:
			return fmt.Errorf("first run fails")
		}
		return nil
	}))
	e.enqueue("t:hot", "holder", nil)
	waitFor(t, 10*time.Second, "holder running", func() bool { return len(o.get()) == 1 })
	for _, id := range []string{"flaky", "after"} {
		e.enqueue("t:hot", id, nil, asynq.MaxRetry(3))
		e.waitState(id, asynq.TaskStateRetry, 10*time.Second)
	}
	close(release)
	e.waitState("after", asynq.TaskStateCompleted, 20*time.Second)
	// asynq's own backoff for a failure is 15s and more: run it now.
	var info *asynq.TaskInfo
	waitFor(t, 20*time.Second, "flaky retried as a failure", func() bool {
		info = e.info("flaky")
		return info.State == asynq.TaskStateRetry && info.Retried == 1
	})
	if !strings.Contains(info.LastErr, "first run fails") {
		t.Errorf("flaky: last error %q, want the handler's", info.LastErr)
	}
	if err := e.insp.RunTask("default", "flaky"); err != nil {
		t.Fatal(err)
	}
	if info = e.waitState("flaky", asynq.TaskStateCompleted, 20*time.Second); info.Retried != 1 {
		t.Errorf("flaky: retried %d, want 1 (one failure)", info.Retried)
	}
	if got, want := o.get(), []string{"holder", "flaky", "after", "flaky"}; !slices.Equal(got, want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	e.wantProcessed("t:hot", ResultFailure, 1)
}

// A delivery of a task that a hand-off chain already ran (the chain's
// worker died before asynq completed it: its done marker is still there)
// completes without running the handler (G8). The marker stays: the worker
// of that delivery may die too before asynq completes the task, and the
// delivery after it must replay it as well.
func TestDeliveryOfHandedOnTaskIsNotRun(t *testing.T) {
	t.Parallel()
	e, runs := countingEnv(t, "t:hot", "hot")
	ctx := context.Background()
	marker := "lockstep:{hot}:done:default:ran"
	if err := e.admin.Set(ctx, marker, outcomeOK, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	e.enqueue("t:hot", "ran", nil)
	e.waitState("ran", asynq.TaskStateCompleted, 10*time.Second)
	// The replay found the lock free: it leaves it free.
	if n := e.admin.Exists(ctx, "lockstep:{hot}").Val(); n != 0 {
		t.Errorf("lock held after a replay (%v)", e.admin.Get(ctx, "lockstep:{hot}").Val())
	}
	e.enqueue("t:hot", "fresh", nil)
	e.waitState("fresh", asynq.TaskStateCompleted, 10*time.Second)
	if runs.Load() != 1 {
		t.Errorf("%d runs, want 1 (fresh only)", runs.Load())
	}
	if v := e.admin.Get(ctx, marker).Val(); v != outcomeOK {
		t.Errorf("done marker after the replay = %q, want it kept (%q)", v, outcomeOK)
	}
}

// A holder that died (its lock is never released, it only expires) hands
// on to no one: the waiters come back after the lock's remaining TTL, the
// first of them takes it and the rest follow by hand-off, in order.
func TestWaitersDrainAfterHolderDied(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	var o order
	e := newEnv(t, cfg, lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		o.add(job.ID)
		return nil
	}))
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	if _, err := e.locker.TryAcquire(ctx, "hot", ttl); err != nil { // never released
		t.Fatal(err)
	}
	died := time.Now()
	var want []string
	for i := range 5 {
		id := fmt.Sprintf("w%d", i)
		want = append(want, id)
		e.enqueue("t:hot", id, nil)
		e.waitState(id, asynq.TaskStateRetry, 10*time.Second)
	}
	for _, id := range want {
		e.waitState(id, asynq.TaskStateCompleted, 20*time.Second)
	}
	// The TTL, then asynq's whole-second retry times and its poll.
	if d := time.Since(died); d > ttl+2500*time.Millisecond {
		t.Errorf("waiters drained %v after the holder died, want within the TTL (%v) and a little", d, ttl)
	}
	if got := o.get(); !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// Wait is woken by the release (a waiter of the one queue), not by its backoff: a
// task waiting with a 3s backoff starts after the release and before its
// backoff could have woken it (3s after it was enqueued, at the earliest).
func TestWaitPolicyWokenByRelease(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Backoff.Min, cfg.Backoff.Max = 3*time.Second, 10*time.Second
	started := make(chan string, 2)
	release := make(chan struct{})
	spec := lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		started <- job.ID
		if job.ID == "holder" {
			<-release
		}
		return nil
	})
	spec.Contention, spec.ContentionWait = Wait, 20*time.Second
	e := newEnv(t, cfg, spec)
	e.addWorker(cfg, spec)
	e.enqueue("t:hot", "holder", nil)
	<-started
	enqueued := time.Now()
	e.enqueue("t:hot", "waiter", nil)
	t.Cleanup(func() { // 1 run in 20 under a CPU hog never saw the waiter queued: what was it doing?
		if t.Failed() {
			info := e.info("waiter")
			t.Logf("waiter: asynq state %v, retried %d, last error %q", info.State, info.Retried, info.LastErr)
		}
	})
	waitFor(t, 10*time.Second, "waiter waiting in its worker, in the resource's queue", func() bool {
		return e.admin.ZCard(context.Background(), "lockstep:{hot}:queue").Val() == 1
	})
	released := time.Now()
	close(release)
	select {
	case id := <-started:
		at := time.Now()
		t.Logf("%s started %v after the release", id, at.Sub(released))
		if backoffWake := enqueued.Add(cfg.Backoff.Min); id != "waiter" || !at.Before(backoffWake) {
			t.Errorf("%s started %v after the release, %v after it was enqueued; want the waiter woken by the release, before its backoff (%v) could have",
				id, at.Sub(released), at.Sub(enqueued), cfg.Backoff.Min)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter never started")
	}
	if info := e.waitState("waiter", asynq.TaskStateCompleted, 10*time.Second); info.LastErr != "" {
		t.Errorf("waiter was requeued: %s", info.LastErr)
	}
}

// Handed-on tasks without a retention are completed by the chain itself, as
// asynq's Done does: gone from every state, counted processed, their
// uniqueness lock freed.
func TestHandoffCompletesTasksAsAsynqDoes(t *testing.T) {
	t.Parallel()
	e, runs, release := heldHot(t)
	const n = 5
	for i := range n {
		id := fmt.Sprintf("u%d", i)
		if _, err := e.enq.Enqueue(asynq.NewTask("t:hot", []byte(id)), asynq.TaskID(id), asynq.Unique(time.Hour)); err != nil {
			t.Fatal(err)
		}
		e.waitState(id, asynq.TaskStateRetry, 10*time.Second)
	}
	close(release)
	waitFor(t, 20*time.Second, "every task processed", func() bool {
		q, err := e.insp.GetQueueInfo("default")
		return err == nil && q.Processed == n+1 && q.Pending+q.Active+q.Retry+q.Scheduled == 0
	})
	if runs.Load() != n+1 {
		t.Errorf("%d runs, want %d", runs.Load(), n+1)
	}
	for i := range n {
		id := fmt.Sprintf("u%d", i)
		if _, err := e.insp.GetTaskInfo("default", id); err == nil {
			t.Errorf("task %s still listed after it completed without a retention", id)
		}
		// Its uniqueness lock is freed: the same task can be enqueued again.
		if _, err := e.enq.Enqueue(asynq.NewTask("t:hot", []byte(id)), asynq.Unique(time.Hour)); err != nil {
			t.Errorf("enqueue of %s's twin: %v (its uniqueness lock left)", id, err)
		}
	}
}

// A done marker lives only as long as its task can be delivered: once the
// chain (or asynq) completed a task, the same task id enqueued again runs
// normally, whether it was the delivered holder or a handed-on waiter, kept
// for a retention or not.
func TestTaskEnqueuedAgainAfterHandOffRuns(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[string]int{}
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		mu.Lock()
		runs[job.ID]++
		first := job.ID == "holder" && runs[job.ID] == 1
		mu.Unlock()
		if first {
			<-release
		}
		return nil
	}))
	ctx := context.Background()
	enqueue := func(id string, opts ...asynq.Option) { t.Helper(); e.enqueueID("t:hot", id, opts...) }
	enqueue("holder")
	waitFor(t, 10*time.Second, "holder running", func() bool { mu.Lock(); defer mu.Unlock(); return runs["holder"] == 1 })
	enqueue("plain")
	e.waitState("plain", asynq.TaskStateRetry, 10*time.Second)
	enqueue("kept", asynq.Retention(time.Second))
	e.waitState("kept", asynq.TaskStateRetry, 10*time.Second)
	close(release)
	waitFor(t, 20*time.Second, "every task done", func() bool {
		q, err := e.insp.GetQueueInfo("default")
		return err == nil && q.Pending+q.Active+q.Retry+q.Scheduled == 0 && q.Processed == 3
	})
	// Once asynq lets the ids be used again (kept: after its 1 s retention),
	// no marker is left to make a new task with the same id complete unrun.
	waitFor(t, 10*time.Second, "no done marker left", func() bool {
		return len(e.admin.Keys(ctx, "lockstep:{hot}:done:*").Val()) == 0
	})
	for _, id := range []string{"holder", "plain"} {
		enqueue(id)
	}
	waitFor(t, 15*time.Second, "kept's retention over", func() bool {
		_, err := e.enq.Enqueue(asynq.NewTask("t:hot", []byte("kept")), asynq.TaskID("kept"))
		return err == nil
	})
	waitFor(t, 20*time.Second, "every id run again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs["holder"] == 2 && runs["plain"] == 2 && runs["kept"] == 2
	})
}

// A recoverer that finds two dead processes forgets only the one whose
// records are all recovered: the other, whose lock has not expired yet,
// stays listed, and its task is recovered once the lock is gone.
func TestRecoveryForgetsOnlyTheProcessItFinished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	ctx := context.Background()
	past := float64(time.Now().Add(-time.Minute).UnixMilli())
	done, waiting := "host-a:1", "host-b:2"
	for _, p := range []string{done, waiting} {
		e.admin.ZAdd(ctx, e.locker.ProcessesKey(), redis.Z{Score: past, Member: p})
	}
	e.admin.SAdd(ctx, e.locker.HoldsKey(done), lock.HoldRecord("ra", "default", "ta"))
	e.admin.SAdd(ctx, e.locker.HoldsKey(waiting), lock.HoldRecord("rb", "default", "tb"))
	// waiting's lock is still its own, for a while: not yet recoverable.
	e.admin.Set(ctx, e.locker.Key("rb"), "00|1|"+url.QueryEscape(waiting)+"|tb|t", 3*time.Second)
	waitFor(t, 10*time.Second, "the server's beats landing for a deadline", e.srv.judging)
	e.srv.recoverDead(ctx)
	if n := e.admin.SCard(ctx, e.locker.HoldsKey(done)).Val(); n != 0 {
		t.Fatalf("the finished process has %d hold records left", n)
	}
	left := e.admin.ZRange(ctx, e.locker.ProcessesKey(), 0, -1).Val()
	if slices.Contains(left, done) || !slices.Contains(left, waiting) {
		t.Fatalf("processes listed after one look: %v; want %s forgotten and %s kept", left, done, waiting)
	}
	if n := e.admin.SCard(ctx, e.locker.HoldsKey(waiting)).Val(); n != 1 {
		t.Fatalf("the waiting process's record was taken before its lock expired (%d left)", n)
	}
	e.admin.Del(ctx, e.locker.Key("rb")) // its lock is gone now
	waitFor(t, 5*time.Second, "the waiting process's record recovered", func() bool {
		return e.admin.SCard(ctx, e.locker.HoldsKey(waiting)).Val() == 0
	})
}

// A recoverer whose own beats could not land (Redis stalled) judges no one
// dead until its beats have landed again for a whole deadline: a stall
// longer than the deadline leaves every live process overdue for a moment
// when Redis comes back, and their records must not be taken then.
func TestRecoveryJudgesNoOneRightAfterRedisStalled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the server's beats landing for a deadline", e.srv.judging)
	e.redis.Pause()
	waitFor(t, 10*time.Second, "a beat failing while Redis is stalled", func() bool { return !e.srv.judging() })
	e.redis.Resume()
	// Overdue, with a record whose lock is gone: what a live process looks
	// like the moment Redis is back, before its next beat lands.
	p := "host-c:3"
	e.admin.ZAdd(ctx, e.locker.ProcessesKey(), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: p})
	e.admin.SAdd(ctx, e.locker.HoldsKey(p), lock.HoldRecord("rc", "default", "tc"))
	e.srv.recoverDead(ctx)
	if n := e.admin.SCard(ctx, e.locker.HoldsKey(p)).Val(); n != 1 {
		t.Fatalf("a record was taken right after Redis stalled (%d left)", n)
	}
	// Once this server's beats have landed for a deadline, p is judged.
	waitFor(t, 10*time.Second, "the server's beats landing again", e.srv.judging)
	e.srv.recoverDead(ctx)
	if n := e.admin.SCard(ctx, e.locker.HoldsKey(p)).Val(); n != 0 {
		t.Fatalf("the overdue process's record was not taken once the server judged (%d left)", n)
	}
}

// A job released with no one waiting is marked done for a recoverer, and
// its marker goes a beat after asynq recorded the task, not after the
// recovery TTL: memory follows what is live.
func TestMarkerOfUncontendedJobGoesAtTheNextBeat(t *testing.T) {
	t.Parallel()
	e, runs := countingEnv(t, "t:alone", "alone")
	e.enqueue("t:alone", "solo", nil)
	e.waitState("solo", asynq.TaskStateCompleted, 10*time.Second)
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
	marker := "lockstep:{alone}:done:default:solo"
	ctx := context.Background()
	waitFor(t, e.srv.recoveryTTL()/2, "done marker gone", func() bool { return e.admin.Exists(ctx, marker).Val() == 0 })
}

// A waiter that asynq has already moved to pending when the chain reaches
// it (its retry time came, or a recoverer brought it back) is on its way to
// a worker: it is granted the lock and keeps its turn, rather than being
// passed over to join the end of the queue.
func TestChainGrantsAPendingWaiterItsTurn(t *testing.T) {
	t.Parallel()
	e, runs, release := heldHot(t)
	ctx := context.Background()
	// "first" waits ahead, pending on a queue no server takes from, so it
	// stays pending; "second" parks behind it.
	e.enqueueID("t:hot", "first", asynq.Queue("other"))
	first := lock.TaskWaiter("other", "first")
	e.admin.ZAdd(ctx, e.locker.QueueKey("hot"), redis.Z{Score: float64(time.Now().UnixMicro()), Member: first})
	e.enqueueID("t:hot", "second", asynq.Retention(time.Hour))
	e.waitState("second", asynq.TaskStateRetry, 10*time.Second)
	close(release)
	granted := "g:" + first + ":"
	waitFor(t, 5*time.Second, "the lock granted to the pending waiter", func() bool {
		return strings.HasPrefix(e.admin.Get(ctx, e.locker.Key("hot")).Val(), granted)
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs once the holder ended, want only the holder's: the waiter behind the pending one ran first", n)
	}
	// The grant outlives no one: once it expires, the waiter behind runs.
	e.waitState("second", asynq.TaskStateCompleted, 20*time.Second)
}

// heldHot is a server whose t:hot jobs count their runs on resource "hot",
// with task "holder" running and holding it until release is closed.
func heldHot(t *testing.T) (*env, *atomic.Int32, chan struct{}) {
	t.Helper()
	runs := new(atomic.Int32)
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:hot", "hot", func(_ context.Context, job Job) error {
		runs.Add(1)
		if job.ID == "holder" {
			<-release
		}
		return nil
	}))
	e.enqueue("t:hot", "holder", nil)
	waitFor(t, 10*time.Second, "holder running", func() bool { return runs.Load() == 1 })
	return e, runs, release
}

// A worker that stops while its slot runs a handed-on task gives asynq the
// delivered task's result at once: that task finished, and asynq completes
// it instead of pushing it back to its queue when its shutdown timeout
// passes. The handed-on task runs on within the grace; interrupted at its
// end, it goes back to its queue with its retry count unchanged, and no
// lock is left behind.
func TestStopCompletesTheDeliveredTaskOfAChain(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.ShutdownTimeout = time.Second
	cfg.Backoff.Min, cfg.Backoff.Max = 3*time.Second, 10*time.Second // parked until handed on
	release := make(chan struct{})
	chained := make(chan struct{})
	var interrupted atomic.Bool
	spec := lockedSpec("t:hot", "hot", func(ctx context.Context, job Job) error {
		switch job.ID {
		case "holder":
			<-release
			return nil
		case "next":
			close(chained)
			<-ctx.Done()
			interrupted.Store(true)
			return ctx.Err()
		}
		return nil
	})
	e := newEnv(t, cfg, spec)
	e.enqueue("t:hot", "holder", nil)
	waitFor(t, 10*time.Second, "holder running", func() bool { return e.info("holder").State == asynq.TaskStateActive })
	e.enqueue("t:hot", "next", nil)
	e.waitState("next", asynq.TaskStateRetry, 10*time.Second) // parked behind holder
	close(release)
	<-chained // handed on, running in holder's slot

	late := proctest.MeasureLateness(t)
	begin := time.Now()
	if err := e.srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Waiting on the chain as on any handler, Stop ends about when the
	// shutdown timeout does (the handed-on task's interruption, its return
	// to asynq, the last records), not a timeout of asynq's later, as when
	// asynq waited for the slot first (twice the timeout).
	if d, bound := time.Since(begin), cfg.ShutdownTimeout+500*time.Millisecond+4*late.Max(); d > bound {
		t.Errorf("stop took %v, want within the shutdown timeout %v and the machine's lateness (bound %v)", d, cfg.ShutdownTimeout, bound)
	}
	if info := e.info("holder"); info.State != asynq.TaskStateCompleted {
		t.Errorf("the delivered task, finished before the stop, is %v after it (retried %d), want completed: asynq pushed it back",
			info.State, info.Retried)
	}
	if !interrupted.Load() {
		t.Error("the handed-on task's context was not cancelled by the stop")
	}
	if info := e.info("next"); info.State != asynq.TaskStatePending || info.Retried != 0 {
		t.Errorf("the interrupted handed-on task is %v with %d retries, want pending again with 0", info.State, info.Retried)
	}
	if keys := e.admin.Keys(context.Background(), "lockstep:{hot}*").Val(); slices.ContainsFunc(keys, func(k string) bool {
		return k == "lockstep:{hot}" || strings.HasPrefix(k, "lockstep:{hot}:permit")
	}) {
		t.Errorf("the lock is still held after the stop: %v", keys)
	}
}
