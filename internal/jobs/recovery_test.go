package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// A hold record of a task that left this process's hands stays while asynq
// still has the task active: its handler returned, but asynq had not
// recorded the result (it retries that while Redis is away), and a worker
// killed then must leave a record for a recoverer, not the task to asynq's
// own lease. Once asynq has the result, the record goes within two beats.
func TestRecordStaysWhileAsynqHasTheTaskActive(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:slow", "slow", func(ctx context.Context, job Job) error {
		<-release
		return nil
	}))
	ctx := context.Background()
	e.enqueueID("t:slow", "kept")
	holds := e.srv.recovery.reg.Holds()
	rec := lock.HoldRecord("slow", "default", "kept")
	waitFor(t, 10*time.Second, "the running task's hold record", func() bool {
		return e.admin.SIsMember(ctx, holds, rec).Val()
	})
	// As if the handler had returned: the record is queued for removal,
	// while asynq still has the task active.
	e.srv.recovery.left("slow", "default", "kept")
	beats := func(n int) {
		t.Helper()
		seen, last := 0, e.admin.ZScore(ctx, e.locker.ProcessesKey(), e.srv.recovery.reg.Process()).Val()
		waitFor(t, 10*time.Second, "beats", func() bool {
			if s := e.admin.ZScore(ctx, e.locker.ProcessesKey(), e.srv.recovery.reg.Process()).Val(); s != last {
				seen, last = seen+1, s
			}
			return seen >= n
		})
	}
	beats(4)
	if !e.admin.SIsMember(ctx, holds, rec).Val() {
		t.Fatal("the record was removed while asynq still had the task active")
	}
	close(release)
	waitFor(t, 10*time.Second, "the task done in asynq", func() bool {
		_, err := e.insp.GetTaskInfo("default", "kept")
		return errors.Is(err, asynq.ErrTaskNotFound) // done, without retention
	})
	beats(3)
	if e.admin.SIsMember(ctx, holds, rec).Val() {
		t.Fatal("the record stayed after asynq recorded the task's result")
	}
}

// A record whose task asynq delivered again since it left this process (its
// lease set further ahead than this delivery's could be: another server's
// delivery or heartbeat) goes at the next beats although the task is
// active: it is another process's task now, and a record of it here would
// keep a recoverer from bringing it back from that process, should it die.
func TestRecordGoesWhenAsynqDeliveredTheTaskAgain(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	e := newEnv(t, testConfig(), lockedSpec("t:slow", "slow", func(ctx context.Context, job Job) error {
		<-release
		return nil
	}))
	ctx := context.Background()
	e.enqueueID("t:slow", "again")
	holds := e.srv.recovery.reg.Holds()
	rec := lock.HoldRecord("slow", "default", "again")
	waitFor(t, 10*time.Second, "the running task's hold record", func() bool {
		return e.admin.SIsMember(ctx, holds, rec).Val()
	})
	e.srv.recovery.left("slow", "default", "again")
	// Another server's delivery of it: a lease a minute ahead.
	if err := e.admin.ZAddXX(ctx, "asynq:{default}:lease", redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: "again"}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the record gone while asynq has the task active", func() bool {
		return !e.admin.SIsMember(ctx, holds, rec).Val()
	})
	if info, err := e.insp.GetTaskInfo("default", "again"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("the task is %v (%v), want still active", info, err)
	}
}

// On a Redis Cluster a worker's beat lands while another master is paused:
// the asynq queue's master here, which holds the states of the tasks that
// left the worker's hands (settled reads them in every beat), and the hold
// records of processes that fall overdue meanwhile (each look at them waits
// on it). A beat that waited for either would leave the worker looking dead
// to the others, who would bring back its task although its handler had
// returned (chaos runs on a Cluster saw a task run twice so).
func TestBeatLandsWhileAnotherMasterIsPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, "cluster-require-full-coverage", "no")
	client := cl.Client(func(o *redis.ClusterOptions) {
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	})
	l := lock.New(client)
	beats := cl.NodeFor(l.ProcessesKey())
	queue := ""
	for i := 0; queue == "" && i < 100; i++ {
		if q := fmt.Sprint("q", i); cl.NodeFor("asynq:{"+q+"}") != beats {
			queue = q
		}
	}
	release := make(chan struct{})
	defer close(release)
	reg, err := NewRegistry([]Spec{lockedSpec("t:slow", "slow", func(context.Context, Job) error { <-release; return nil })})
	if err != nil {
		t.Fatal(err)
	}
	wd := watchdog.New(watchdog.Options{})
	cfg := testConfig()
	cfg.LockTTL, cfg.Queues = 1500*time.Millisecond, map[string]int{queue: 1}
	srv := NewServer(Params{Client: client, Locker: l, Watchdog: wd, Registry: reg, Config: cfg})
	if err := wd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
		_ = wd.Stop(sctx)
	}()
	enq := asynq.NewClientFromRedisClient(client)
	defer enq.Close()
	if _, err := enq.Enqueue(asynq.NewTask("t:slow", nil), asynq.TaskID("kept"), asynq.Queue(queue)); err != nil {
		t.Fatal(err)
	}
	rec := lock.HoldRecord("slow", queue, "kept")
	waitFor(t, 10*time.Second, "the running task's hold record", func() bool {
		return client.SIsMember(ctx, srv.recovery.reg.Holds(), rec).Val()
	})
	// asynq's dequeue noted the worker in the task on a Cluster too.
	if held, err := asynqstore.New(client).Holds(ctx, []asynqstore.Task{{Queue: queue, ID: "kept"}}); err != nil || held[0].By != srv.recovery.reg.Process() {
		t.Errorf("the running task: %+v %v, want it delivered by %s", held, err, srv.recovery.reg.Process())
	}
	// As if the handler had returned: every beat now asks asynq, on the
	// queue's master, whether it still has the task.
	srv.recovery.left("slow", queue, "kept")
	paused := cl.NodeFor("asynq:{" + queue + "}")
	waitFor(t, 10*time.Second, "this process judging others", srv.judging)
	// Processes overdue in 300 ms, whose hold records lie on that master.
	overdue := float64(time.Now().Add(300 * time.Millisecond).UnixMilli())
	for i, n := 0, 0; n < 6 && i < 1000; i++ {
		if p := fmt.Sprint("gone:", i); cl.NodeFor(l.HoldsKey(p)) == paused {
			n++
			client.SAdd(ctx, l.HoldsKey(p), lock.HoldRecord("gone", queue, fmt.Sprint("g", i)))
			client.ZAdd(ctx, l.ProcessesKey(), redis.Z{Score: overdue, Member: p})
		}
	}
	paused.Pause()
	defer paused.Resume()
	// For 5 s, the process must never look dead to the others: its beat's
	// deadline in the processes zset always ahead of the clock.
	admin := beats.Client()
	seen, last := 0, admin.ZScore(ctx, l.ProcessesKey(), srv.recovery.reg.Process()).Val()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		s := admin.ZScore(ctx, l.ProcessesKey(), srv.recovery.reg.Process()).Val()
		if now := float64(time.Now().UnixMilli()); s < now {
			t.Fatalf("the process looked dead while a master was paused: its beat overdue by %v", time.Duration(now-s)*time.Millisecond)
		}
		if s != last {
			seen, last = seen+1, s
		}
	}
	if seen < 3 {
		t.Fatalf("%d beats landed in 5s while the queue's master was paused, want 3 (one each %v)", seen, srv.beatInterval())
	}
}

// A worker killed in the moment of parking a task: asynq handed it the task
// (its dequeue recorded it), its take found the lock busy and put the task
// among the waiters, and it died before asynq had the task back in its
// retry set. The holder's release meanwhile handed the lock on to that task
// and, finding it still active, left it to asynq (chain.go's deliver), with
// a record of it. Such a record holds nothing back: the releasing worker
// drops it at its beats although asynq has the task active (another
// worker's dequeue made it so), and a live process's record of it (here
// one that parked it earlier and kept its record) does not keep a
// recoverer from bringing it back. It is back within TTL + 3 s of the
// death, not by asynq's lease (which the worker's own asynq server, frozen
// here rather than killed, would even keep extending).
func TestParkingWorkerKilledTaskComesBack(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	cfg := testConfig()
	e := newEnv(t, cfg, lockedSpec("t:hold", "parking", func(ctx context.Context, job Job) error {
		<-release
		return nil
	}))
	ctx := context.Background()
	e.enqueueID("t:hold", "holder")
	e.waitState("holder", asynq.TaskStateActive, 10*time.Second)
	waitFor(t, 10*time.Second, "the holder's lock", func() bool {
		return e.admin.Exists(ctx, "lockstep:{parking}").Val() == 1
	})

	// The worker that dies: its own process id, beats and asynq server, on
	// queue "dying" (the live one serves "default" only). Its handler does
	// what a job server's does up to the parking, then never returns.
	const dead, queue = "dying:1", "dying"
	reg := e.locker.Registry(e.client, dead)
	if err := reg.Beat(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	parked, frozen := make(chan string, 1), make(chan struct{})
	c := e.redis.Client()
	w := asynq.NewServerFromRedisClient(asynqstore.RecordDequeues(c, reg.Holds(), dead, func(queue, id string) string { return lock.HoldRecord("", queue, id) }),
		asynq.Config{Concurrency: 1, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel, TaskCheckInterval: 20 * time.Millisecond})
	if err := w.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		r, err := e.locker.Take(ctx, "parking", queue, id, cfg.LockTTL, time.Minute, true, reg.Holds(), 1, nil)
		if err != nil || r.Lease != nil || r.Joined.IsZero() {
			parked <- fmt.Sprintf("take: %+v %v, want busy and joined", r, err)
		} else {
			parked <- ""
		}
		<-frozen
		return errors.New("parked")
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Shutdown(); _ = c.Close() })
	t.Cleanup(func() { close(frozen) })
	e.enqueueID("t:parked", "parked", asynq.Queue(queue))
	select {
	case msg := <-parked:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dying worker did not take its task")
	}

	// The holder ends: its release hands the lock on to the parked task,
	// which the live worker finds still active and leaves to asynq, with a
	// record of it.
	close(release)
	rec := lock.HoldRecord("parking", queue, "parked")
	waitFor(t, 10*time.Second, "the live worker's record of the task handed on", func() bool {
		return e.admin.SIsMember(ctx, e.srv.recovery.reg.Holds(), rec).Val()
	})
	// Gone within a few beats (one each 100 ms), before asynq's heartbeat
	// of the frozen worker (5 s after its start) pushed the task's lease on.
	waitFor(t, 3*time.Second, "the record of the task handed on gone while the task is active", func() bool {
		return !e.admin.SIsMember(ctx, e.srv.recovery.reg.Holds(), rec).Val()
	})
	if info, err := e.insp.GetTaskInfo(queue, "parked"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("the task is %v (%v), want still active in the dying worker's hands", info, err)
	}
	// A live process that had the task before and kept its record.
	other := e.locker.Registry(e.client, "alive:2")
	if err := other.Beat(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := other.Record(ctx, lock.HoldRecord("", queue, "parked")); err != nil {
		t.Fatal(err)
	}
	// The worker dies now: its beat is over.
	died := time.Now()
	if err := reg.Beat(ctx, died); err != nil {
		t.Fatal(err)
	}
	back := backWithin(t, e, queue, "parked", died, cfg.LockTTL+3*time.Second)
	if n := testutil.ToFloat64(e.metrics.JobsRecovered.WithLabelValues("t:parked")); n != 1 {
		t.Errorf("lockstep_jobs_recovered_total{t:parked} = %v, want 1", n)
	}
	// The release that handed the lock on said what it saw: the task was
	// still active when the grant's TTL passed.
	e.logs.Wait(t, 0, 5*time.Second, nil, "the hand-off's log of a task still active",
		proctest.Msg("granted task still active when its grant expired; the next waiter takes the lock", "id", "parked"))
	t.Logf("back in its queue %v after its worker's death", back.Round(time.Millisecond))
}

// A worker that stops gracefully leaves to recovery a task that asynq could
// not move back (its Retry failed: "Could not move task", as when Redis was
// away as it tried), instead of deleting its record with the rest: the task
// stays active in the stopped worker's name, and only asynq's own lease
// would bring it back, a minute or more later. Here the stopping worker's
// Redis user may not write asynq's retry set of its queue, so asynq's Retry
// of the task is refused before it changes anything (NOPERM), as a Redis
// away would; a live worker brings the task back to its queue within the
// lock TTL's bound of the stop. (Not parallel: addWorkerAs.)
func TestGracefulStopLeavesAnUnmovedTaskToRecovery(t *testing.T) {
	var runs atomic.Int32
	spec := Spec{
		Type:   "t:unmoved",
		Decode: func(b []byte) (any, error) { return string(b), nil },
		Run: func(context.Context, Job, any) error {
			runs.Add(1)
			return errors.New("failed; asynq cannot move it to its retry set")
		},
	}
	cfg := testConfig()
	e := newEnv(t, cfg, spec) // the live worker, on queue default
	const queue = "stopq"
	ctx := context.Background()
	if err := e.admin.Do(ctx, "ACL", "SETUSER", "stopper", "on", ">pw", "+@all", "&*", "%R~*",
		"~lockstep*", "~asynq:[^{]*", "~asynq:{"+queue+"}:[^r]*").Err(); err != nil {
		t.Fatal(err)
	}
	scfg := cfg
	scfg.Queues = map[string]int{queue: 1}
	c := e.redis.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.Username, o.Password = "stopper", "pw" })
	stopper := e.addWorkerWith(c, "stopping:1", scfg, spec)
	e.enqueue("t:unmoved", "unmoved", []byte("x"), asynq.Queue(queue), asynq.MaxRetry(3))
	e.logs.Wait(t, 0, 10*time.Second, nil, "asynq's log that it could not move the task", func(rec map[string]any) bool {
		msg, _ := rec["msg"].(string)
		return strings.HasPrefix(msg, "Could not move task id=unmoved")
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := stopper.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if info, err := e.insp.GetTaskInfo(queue, "unmoved"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("after the stop the task is %v (%v), want still active: asynq moved it after all", info, err)
	}
	back := backWithin(t, e, queue, "unmoved", stopped, cfg.LockTTL+3*time.Second)
	e.logs.Wait(t, 0, time.Second, nil, "the stopped worker's warning", proctest.Msg(
		"worker stopped with tasks asynq still has active in its name; a live worker brings them back"))
	if n := testutil.ToFloat64(e.metrics.JobsRecovered.WithLabelValues("t:unmoved")); n != 1 {
		t.Errorf("lockstep_jobs_recovered_total{t:unmoved} = %v, want 1", n)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
	t.Logf("back in its queue %v after its worker's graceful stop", back.Round(time.Millisecond))
}

// backWithin waits (15 s at most) for task id of queue to be pending again
// in asynq, and fails the test unless that came within bound of since (a
// worker's death or stop). It returns how long after since it came back.
func backWithin(t *testing.T, e *env, queue, id string, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	var back time.Duration
	waitFor(t, 15*time.Second, id+" back in its queue", func() bool {
		info, err := e.insp.GetTaskInfo(queue, id)
		back = time.Since(since)
		return err == nil && info.State == asynq.TaskStatePending
	})
	if back > bound {
		t.Errorf("%s came back in its queue %v after its worker's death or stop, want within %v", id, back, bound)
	}
	return back
}
