package asynqstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// The contract of this package with asynq: each operation of the adapter
// (enqueue, dequeue, park, wake, claim, extend, recover, complete), run on
// tasks that asynq's own client enqueued and its own server ran, leaves
// what asynq's own Inspector reports, and asynq's server carries on from
// there as with a task it had handled itself. A change of asynq's layout
// (a key, a state, a field of the task hash, its enqueue's EVALSHA) fails
// one of these tests: run them (go test -run TestContract) after any change
// of asynq's version, then change Version.

// TestContractVersion ties Version to the asynq this module requires: a
// bump of asynq in go.mod fails here until the adapter is checked against
// it.
func TestContractVersion(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == asynqModule {
			if f[1] != Version {
				t.Fatalf("go.mod requires asynq %s; asynqstore was written for %s: check the contract, then Version", f[1], Version)
			}
			return
		}
	}
	t.Fatalf("go.mod does not require %s", asynqModule)
}

// enqueue: asynq's client over PipelineEnqueues hands every enqueue to the
// pipeline (one EVALSHA each), and the tasks are what asynq's own enqueue
// makes of them: pending, scheduled, unique (a second enqueue refused).
func TestContractEnqueue(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	var mu sync.Mutex
	sent := 0
	send := func(ctx context.Context, cmd *redis.Cmd) error {
		mu.Lock()
		sent++
		mu.Unlock()
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Process(ctx, cmd) })
		return nil
	}
	enq := asynq.NewClientFromRedisClient(PipelineEnqueues(c, send))
	t.Cleanup(func() { _ = enq.Close() })
	insp := asynq.NewInspectorFromRedisClient(c)
	t.Cleanup(func() { _ = insp.Close() })

	task := func(p string) *asynq.Task { return asynq.NewTask("t:enq", []byte(p)) }
	enqueues := []struct {
		id   string
		opts []asynq.Option
		want asynq.TaskState
	}{
		{"plain", nil, asynq.TaskStatePending},
		{"later", []asynq.Option{asynq.ProcessIn(time.Hour)}, asynq.TaskStateScheduled},
		{"unique", []asynq.Option{asynq.Unique(time.Hour)}, asynq.TaskStatePending},
		{"unique-later", []asynq.Option{asynq.Unique(time.Hour), asynq.ProcessIn(time.Hour)}, asynq.TaskStateScheduled},
	}
	for _, e := range enqueues {
		if _, err := enq.Enqueue(task(e.id), append(e.opts, asynq.TaskID(e.id))...); err != nil {
			t.Fatalf("%s: %v", e.id, err)
		}
		info, err := insp.GetTaskInfo("default", e.id)
		if err != nil || info.State != e.want || string(info.Payload) != e.id {
			t.Errorf("%s: asynq reports %v %v, want %v", e.id, info, err, e.want)
		}
	}
	if _, err := enq.Enqueue(task("unique"), asynq.Unique(time.Hour)); !errors.Is(err, asynq.ErrDuplicateTask) {
		t.Errorf("second unique enqueue: %v, want asynq.ErrDuplicateTask", err)
	}
	if _, err := enq.Enqueue(task("other"), asynq.TaskID("plain")); !errors.Is(err, asynq.ErrTaskIDConflict) {
		t.Errorf("enqueue of a taken id: %v, want asynq.ErrTaskIDConflict", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := len(enqueues) + 2; sent != want {
		t.Errorf("%d commands went through the pipeline, want one per enqueue (%d)", sent, want)
	}
}

// dequeue: an asynq server on RecordDequeues' client runs its tasks as asynq
// would (its Inspector sees them active, then processed), and each task is
// in the holds set from the moment asynq hands it over: before its handler
// runs. An id that JSON would escape is run, not recorded.
func TestContractDequeue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	const holds = "test:holds"
	record := func(queue, id string) string { return "rec:" + queue + ":" + id + ":end" }
	running := make(chan string, 2)
	release := make(chan struct{})
	w := asynq.NewServerFromRedisClient(RecordDequeues(c, holds, "worker:1", record), asynq.Config{Concurrency: 2, LogLevel: asynq.FatalLevel})
	if err := w.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		running <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Shutdown)
	enq := asynq.NewClientFromRedisClient(c)
	t.Cleanup(func() { _ = enq.Close() })
	for _, id := range []string{"plain-1", `quoted"id`} {
		if _, err := enq.Enqueue(asynq.NewTask("t:rec", nil), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	for range 2 {
		select {
		case <-running:
		case <-time.After(10 * time.Second):
			t.Fatal("asynq did not run the tasks")
		}
	}
	got, err := c.SMembers(t.Context(), holds).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != record("default", "plain-1") {
		t.Errorf("holds set %q, want only %q", got, record("default", "plain-1"))
	}
	for _, id := range []string{"plain-1", `quoted"id`} {
		if info, err := insp.GetTaskInfo("default", id); err != nil || info.State != asynq.TaskStateActive {
			t.Errorf("%s: %v %v, want active", id, info, err)
		}
		// The Inspector does not show leases: without one, asynq's
		// recoverer would never bring the task of a dead worker back.
		if err := c.ZScore(t.Context(), queuePrefix("default")+"lease", id).Err(); err != nil {
			t.Errorf("%s dequeued without a lease: %v", id, err)
		}
		// Whose delivery it is, recorded or not.
		if held, err := New(c).Holds(t.Context(), []Task{{Queue: "default", ID: id}}); err != nil || held[0].By != "worker:1" {
			t.Errorf("%s: Holds %+v %v, want it delivered by worker:1", id, held, err)
		}
	}
	close(release)
	redistest.WaitFor(t, 10*time.Second, "both tasks processed", func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Processed == 2 && q.Active == 0
	})

	// A queue paused by asynq's Inspector gives nothing: a dequeue of
	// asynq's shape, sent at once rather than waited for from the server.
	if err := insp.PauseQueue("default"); err != nil {
		t.Fatal(err)
	}
	if _, err := enq.Enqueue(asynq.NewTask("t:rec", nil), asynq.TaskID("paused-1")); err != nil {
		t.Fatal(err)
	}
	p := queuePrefix("default")
	err = RecordDequeues(c, holds, "worker:1", record).EvalSha(t.Context(), "asynq's sha", []string{p + "pending", p + "paused", p + "active", p + "lease"},
		time.Now().Add(30*time.Second).Unix(), p+"t:").Err()
	if !errors.Is(err, redis.Nil) {
		t.Errorf("dequeue from a paused queue: %v, want nothing", err)
	}
	if info, err := insp.GetTaskInfo("default", "paused-1"); err != nil || info.State != asynq.TaskStatePending {
		t.Errorf("paused-1: %v %v, want pending", info, err)
	}
}

// dequeue on a Cluster, where the holds set lies in another slot than the
// queue: RecordDequeues with no holds set only notes the worker in the task
// (Holds reads it), and asynq runs the task as its own (its Inspector sees
// it active, then processed).
func TestContractDequeueOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3).Client()
	running, release := make(chan string, 1), make(chan struct{})
	w := asynq.NewServerFromRedisClient(RecordDequeues(c, "", "worker:1", nil), asynq.Config{Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := w.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		running <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Shutdown)
	enq := asynq.NewClientFromRedisClient(c)
	t.Cleanup(func() { _ = enq.Close() })
	if _, err := enq.Enqueue(asynq.NewTask("t:rec", nil), asynq.TaskID("on-cluster")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("asynq did not run the task")
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	if info, err := insp.GetTaskInfo("default", "on-cluster"); err != nil || info.State != asynq.TaskStateActive {
		t.Errorf("on-cluster: %v %v, want active", info, err)
	}
	if held, err := New(c).Holds(t.Context(), []Task{{Queue: "default", ID: "on-cluster"}}); err != nil || !held[0].Active || held[0].By != "worker:1" {
		t.Errorf("Holds %+v %v, want it active, delivered by worker:1", held, err)
	}
	close(release)
	redistest.WaitFor(t, 10*time.Second, "the task processed", func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Processed == 1 && q.Active == 0
	})
}

// park: a task returned to asynq with RetryDelay(d) waits in the retry set,
// no failure counted, and asynq delivers it again no earlier than d after.
func TestContractPark(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.enqueue("park-soon")
	w.waitState("park-soon", "retry retried=0")
	parked := w.parkedAt("park-soon")
	ready := parked.Add(parkSoon)
	info, err := w.insp.GetTaskInfo("default", "park-soon")
	if err != nil {
		t.Fatal(err)
	}
	if info.NextProcessAt.Before(ready) || info.NextProcessAt.After(ready.Add(time.Second)) {
		t.Errorf("parked at %v for %v: asynq reports it next at %v, want within a second after %v",
			parked.Format(time.StampMilli), parkSoon, info.NextProcessAt.Format(time.StampMilli), ready.Format(time.StampMilli))
	}
	redistest.WaitFor(t, 10*time.Second, "park-soon run again", func() bool { return w.runs("park-soon") == 2 })
	if again := w.ranAt("park-soon"); again.Before(ready) {
		t.Errorf("parked at %v for %v, run again at %v: too soon", parked.Format(time.StampMilli), parkSoon, again.Format(time.StampMilli))
	}
	w.waitState("park-soon", "gone")
	if q := w.queue(); q.Processed != 1 || q.Failed != 0 {
		t.Errorf("asynq counts processed %d, failed %d; want 1 and 0 (a park is neither)", q.Processed, q.Failed)
	}
}

// wake: a parked task moves to the head of its queue, pending, and asynq
// runs it; a task in any other state is left as it is, and Wake says which.
func TestContractWake(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.parked("park-1")
	w.parked("park-2")
	w.active("hold-1")
	w.completed("done-1")
	w.pause()
	w.enqueue("pending-1")

	for _, c := range []struct {
		id    string
		want  Woken
		state string
	}{
		{"park-2", WokenMoved, "pending retried=0"},
		{"park-2", WokenNot, "pending retried=0"},
		{"hold-1", WokenActive, "active retried=0"},
		{"done-1", WokenNot, "completed retried=0"},
		{"pending-1", WokenNot, "pending retried=0"},
		{"nothing", WokenGone, "gone"},
	} {
		got, err := w.store.Wake(t.Context(), "default", c.id)
		if err != nil || got != c.want {
			t.Errorf("Wake(%s) = %v %v, want %v", c.id, got, err, c.want)
		}
		if s := w.state(c.id); s != c.state {
			t.Errorf("after Wake(%s) asynq reports %q, want %q", c.id, s, c.state)
		}
	}
	// The woken task is first in line, before the task that was pending
	// before it; asynq then runs it.
	if p, err := w.insp.ListPendingTasks("default"); err != nil || len(p) != 2 || p[0].ID != "park-2" {
		var ids []string
		for _, info := range p {
			ids = append(ids, info.ID)
		}
		t.Errorf("asynq's pending tasks %v %v, want park-2 first of 2", ids, err)
	}
	w.unpause()
	redistest.WaitFor(t, 10*time.Second, "woken and pending tasks run", func() bool {
		return w.runs("park-2") == 2 && w.runs("pending-1") == 1
	})
	w.waitState("park-2", "gone")
	w.waitState("park-1", "retry retried=0")
}

// next, park pending and wake last (a fair share): Next reads the tasks a
// worker took last and the next pending ones in enqueue order, with their
// messages; Park moves pending tasks to the retry set (asynq reports them
// retry, unretried, and does not run them), leaving one that is not pending
// alone; WakeLast brings them back behind every pending task, in the order
// woken, and asynq runs them unretried.
func TestContractNextParkWakeLast(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.active("hold-1")
	w.pause()
	for _, id := range []string{"fair-1", "fair-2", "fair-3", "other-1"} {
		w.enqueue(id)
	}
	seen, err := w.store.Next(t.Context(), "default", 4, 3, nil)
	var got []string
	for _, x := range seen {
		got = append(got, fmt.Sprintf("%s/%s/%v", x.ID, x.Msg.Payload, x.Active))
	}
	if want := []string{"hold-1/hold-1/true", "fair-1/fair-1/false", "fair-2/fair-2/false", "fair-3/fair-3/false"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("Next = %v %v, want %v", got, err, want)
	}
	moved, err := w.store.Park(t.Context(), "default", []string{"fair-1", "fair-2", "fair-3", "hold-1"}, time.Now().Add(time.Hour))
	if err != nil || !slices.Equal(moved, []string{"fair-1", "fair-2", "fair-3"}) {
		t.Errorf("Park = %v %v, want the 3 pending ones", moved, err)
	}
	for id, want := range map[string]string{"fair-1": "retry retried=0", "fair-3": "retry retried=0", "hold-1": "active retried=0", "other-1": "pending retried=0"} {
		if s := w.state(id); s != want {
			t.Errorf("after Park asynq reports %s %q, want %q", id, s, want)
		}
	}
	for _, id := range []string{"fair-2", "fair-1"} {
		if got, err := w.store.WakeLast(t.Context(), "default", id); err != nil || got != WokenMoved {
			t.Errorf("WakeLast(%s) = %v %v, want moved", id, got, err)
		}
	}
	p, err := w.insp.ListPendingTasks("default")
	var ids []string
	for _, info := range p {
		ids = append(ids, info.ID)
	}
	if want := []string{"other-1", "fair-2", "fair-1"}; err != nil || !slices.Equal(ids, want) {
		t.Errorf("asynq's pending tasks %v %v, want %v: woken behind the pending one, in the order woken", ids, err, want)
	}
	w.unpause()
	redistest.WaitFor(t, 10*time.Second, "woken tasks run", func() bool { return w.runs("fair-1") == 1 && w.runs("fair-2") == 1 })
	if w.runs("fair-3") != 0 {
		t.Errorf("fair-3, parked and not woken, ran")
	}
	w.waitState("fair-1", "gone")
	w.waitState("fair-3", "retry retried=0")
}

// claim, extend and complete: a chain claims a parked task (its retry score
// becomes the claim's lease), extends the lease, and completes it as asynq's
// Done does: deleted, or kept completed for its retention, counted
// processed, its uniqueness lock freed. A claim whose lease passes leaves
// the task to asynq's forwarder.
func TestContractClaimExtendComplete(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.parked("park-1")
	w.parked("park-kept", asynq.Retention(time.Hour))
	w.parked("park-unique", asynq.Unique(time.Hour))
	w.parked("park-lapsed")
	w.active("hold-1")
	w.completed("done-1")
	w.pause()
	w.enqueue("pending-1")
	before := w.queue()
	ctx := t.Context()
	retryAt := func(id string) time.Time {
		t.Helper()
		info, err := w.insp.GetTaskInfo("default", id)
		if err != nil || info.State != asynq.TaskStateRetry {
			t.Fatalf("%s: %v %v, want in the retry set", id, info, err)
		}
		return info.NextProcessAt
	}
	claim := func(done *Finished, id string, lease time.Time, want Claimed) (bool, TaskMsg, []byte) {
		t.Helper()
		completed, got, msg, err := w.store.Claim(ctx, done, "default", id, lease)
		if err != nil || got != want {
			t.Fatalf("Claim(%v, %s) = %v %v, want %v", done, id, got, err, want)
		}
		var m TaskMsg
		if got == ClaimedOK {
			if m, err = DecodeTaskMsg(msg); err != nil || m.ID != id || m.Type != "t:world" || string(m.Payload) != id {
				t.Fatalf("claimed %s: message %+v %v", id, m, err)
			}
			if at := retryAt(id); !at.Equal(time.Unix(lease.Unix()+1, 0)) {
				t.Errorf("claimed %s with lease %v: asynq has it next at %v", id, lease, at)
			}
		}
		return completed, m, msg
	}

	// claim and extend
	lease := time.Now().Add(time.Minute)
	claim(nil, "park-1", lease, ClaimedOK)
	lease = lease.Add(time.Minute)
	if err := w.store.ExtendClaim(ctx, "default", "park-1", lease); err != nil {
		t.Fatal(err)
	}
	if at := retryAt("park-1"); !at.Equal(time.Unix(lease.Unix()+1, 0)) {
		t.Errorf("extended to %v: asynq has it next at %v", lease, at)
	}
	if err := w.store.ExtendClaim(ctx, "default", "nothing", lease); err != nil {
		t.Fatal(err)
	}
	// The other states are not claimed.
	claim(nil, "hold-1", lease, ClaimedActive)
	claim(nil, "pending-1", lease, ClaimedPending)
	claim(nil, "done-1", lease, ClaimedNot)
	claim(nil, "nothing", lease, ClaimedNot)

	// complete one (deleted), claim the next in the same call
	completed, kept, keptMsg := claim(&Finished{Queue: "default", ID: "park-1"}, "park-kept", lease, ClaimedOK)
	if !completed {
		t.Error("park-1 not completed")
	}
	if s := w.state("park-1"); s != "gone" {
		t.Errorf("park-1 completed without retention: asynq reports %q, want it gone", s)
	}
	// complete one with retention (kept completed), claim the next
	now := time.Now()
	_, unique, _ := claim(&Finished{Queue: "default", ID: "park-kept", Retention: time.Duration(kept.Retention) * time.Second, Msg: keptMsg},
		"park-unique", lease, ClaimedOK)
	if info, err := w.insp.GetTaskInfo("default", "park-kept"); err != nil || info.State != asynq.TaskStateCompleted ||
		info.CompletedAt.Before(now.Truncate(time.Second)) || info.CompletedAt.After(now.Add(10*time.Second)) || string(info.Payload) != "park-kept" {
		t.Errorf("park-kept completed with retention: asynq reports %+v %v, want completed at %v", info, err, now)
	}
	// complete a unique one: its uniqueness lock is freed
	if completed, _, _ := claim(&Finished{Queue: "default", ID: "park-unique", Unique: unique.UniqueKey}, "", lease, ClaimedNot); !completed {
		t.Error("park-unique not completed")
	}
	if _, err := w.enq.Enqueue(asynq.NewTask("t:world", []byte("park-unique")), asynq.Unique(time.Hour)); err != nil {
		t.Errorf("enqueue of park-unique's twin after its completion: %v", err)
	}
	// a task completed already is not completed twice
	if completed, _, _ := claim(&Finished{Queue: "default", ID: "park-1"}, "", lease, ClaimedNot); completed {
		t.Error("park-1 completed twice")
	}
	if q := w.queue(); q.Processed != before.Processed+3 || q.ProcessedTotal != before.ProcessedTotal+3 || q.Failed != before.Failed {
		t.Errorf("asynq counts processed %d (total %d), failed %d; want %d (%d) and %d",
			q.Processed, q.ProcessedTotal, q.Failed, before.Processed+3, before.ProcessedTotal+3, before.Failed)
	}

	// A claim whose lease passes (its chain died) is delivered again by
	// asynq's forwarder.
	w.unpause()
	claim(nil, "park-lapsed", time.Now(), ClaimedOK)
	redistest.WaitFor(t, 10*time.Second, "the lapsed claim run by asynq", func() bool { return w.runs("park-lapsed") == 2 })
	w.waitState("park-lapsed", "gone")
}

// recover: a dead worker's active task, and a task claimed by a dead chain,
// go back to the head of their queue, pending, their retry count as it was;
// RecoverActive leaves a task in the retry set; an active task that
// another worker's dequeue delivered is left to it; any other state is
// left as it is. asynq then runs the recovered tasks as its own.
func TestContractRecover(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.active("hold-1") // its handler never returns: a frozen worker
	w.active("hold-2")
	w.active("hold-3")
	w.parked("park-claimed")
	w.parked("park-1")
	w.completed("done-1")
	w.pause()
	w.enqueue("pending-1")
	ctx := t.Context()
	if _, c, _, err := w.store.Claim(ctx, nil, "default", "park-claimed", time.Now().Add(time.Hour)); err != nil || c != ClaimedOK {
		t.Fatalf("claim: %v %v", c, err)
	}
	for _, c := range []struct {
		id         string
		activeOnly bool
		by         string // the dead worker
		recovered  bool
		state      string
	}{
		{"hold-1", false, worldWorker, true, "pending retried=0"},
		{"hold-1", false, worldWorker, false, "pending retried=0"},
		{"hold-2", true, worldWorker, true, "pending retried=0"},
		{"hold-3", true, "other:2", false, "active retried=0"}, // a leftover record of a dead worker
		{"hold-3", false, "other:2", false, "active retried=0"},
		{"hold-3", true, "", true, "pending retried=0"}, // not checked
		{"park-1", true, worldWorker, false, "retry retried=0"},
		{"park-claimed", false, "other:2", true, "pending retried=0"}, // not active: the claim's
		{"done-1", false, worldWorker, false, "completed retried=0"},
		{"pending-1", false, worldWorker, false, "pending retried=0"},
		{"nothing", false, worldWorker, false, "gone"},
	} {
		recover := w.store.Recover
		if c.activeOnly {
			recover = w.store.RecoverActive
		}
		m, err := recover(ctx, "default", c.id, c.by)
		switch {
		case err != nil:
			t.Errorf("recover %s: %v", c.id, err)
		case c.recovered && (m == nil || m.ID != c.id || string(m.Payload) != c.id):
			t.Errorf("recover %s: message %+v, want its own", c.id, m)
		case !c.recovered && m != nil:
			t.Errorf("recover %s: recovered %+v, want it left alone", c.id, m)
		}
		if s := w.state(c.id); s != c.state {
			t.Errorf("after recovering %s asynq reports %q, want %q", c.id, s, c.state)
		}
	}
	if q := w.queue(); q.Active != 0 || q.Pending != 5 || q.Retry != 1 {
		t.Errorf("asynq reports %d active, %d pending and %d retry; want 0, 5 and 1", q.Active, q.Pending, q.Retry)
	}
	// The Inspector does not show leases: a recovered task's lease left
	// behind would have asynq's recoverer take the task back as failed.
	for _, id := range []string{"hold-1", "hold-2", "hold-3"} {
		if err := w.c.ZScore(ctx, queuePrefix("default")+"lease", id).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("%s recovered with its lease left: %v", id, err)
		}
	}
	w.unpause()
	redistest.WaitFor(t, 10*time.Second, "the recovered tasks run again", func() bool {
		return w.runs("hold-1") == 2 && w.runs("hold-2") == 2 && w.runs("hold-3") == 2 && w.runs("park-claimed") == 2
	})
	for _, id := range []string{"hold-1", "hold-2", "hold-3", "park-claimed", "pending-1"} {
		w.waitState(id, "gone")
	}
}

// holds: Holds says which tasks asynq has active (a handler running, or one
// that returned and whose result asynq has not recorded) and which it may
// still deliver, as its own Inspector reports their states.
func TestContractHolds(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.active("hold-1")
	w.parked("park-1")
	w.completed("done-1")
	kept := "kept-1"
	w.enqueue(kept, asynq.Retention(time.Hour))
	w.waitState(kept, "completed retried=0")
	w.pause()
	w.enqueue("pending-1")
	w.enqueue("later-1", asynq.ProcessIn(time.Hour))
	ids := []string{"hold-1", "park-1", "done-1", kept, "pending-1", "later-1", "nothing"}
	tasks := make([]Task, len(ids))
	for i, id := range ids {
		tasks[i] = Task{Queue: "default", ID: id}
	}
	got, err := w.store.Holds(t.Context(), tasks)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		state := w.state(id)
		active := strings.HasPrefix(state, "active")
		deliverable := active || strings.HasPrefix(state, "pending") || strings.HasPrefix(state, "retry") || strings.HasPrefix(state, "scheduled")
		if got[i].Active != active || got[i].Deliverable != deliverable {
			t.Errorf("Holds says %s is %+v; asynq reports %q", id, got[i], state)
		}
	}
	if !got[0].Active || !got[1].Deliverable || got[2].Deliverable || got[3].Deliverable {
		t.Errorf("running, parked, done, kept: %+v, want active, deliverable, neither, neither", got[:4])
	}
	// The running task's lease is asynq's: Lease ahead of its delivery, and
	// of its server's last heartbeat (every 5 s) since; the others have none.
	if ahead := time.Until(got[0].Lease); ahead <= Lease-7*time.Second || ahead > Lease+time.Second {
		t.Errorf("the running task's lease ends %v from now, want about %v (asynq's, pushed on every 5 s)", ahead, Lease)
	}
	if got[0].By != worldWorker {
		t.Errorf("the running task delivered by %q, want %q (RecordDequeues)", got[0].By, worldWorker)
	}
	for i := 1; i < len(ids); i++ {
		if !got[i].Lease.IsZero() || got[i].By != "" {
			t.Errorf("%s has a lease (%v) or a worker (%q); only an active task has them", ids[i], got[i].Lease, got[i].By)
		}
	}
}

// world is an asynq server whose handler does what a task's id says:
// "park-soon" and "park-*" are parked on their first run (RetryDelay of
// parkSoon, or an hour), "hold-*" blocks on its first run until the test
// ends, anything else succeeds.
type world struct {
	t     *testing.T
	c     *redis.Client
	store *Store
	enq   *asynq.Client
	insp  *asynq.Inspector

	mu     sync.Mutex
	run    map[string][]time.Time // each run's start
	parkAt map[string]time.Time
}

const parkSoon = 1500 * time.Millisecond

// worldWorker is the process a world's server delivers its tasks as
// (RecordDequeues).
const worldWorker = "world:1"

var errParked = errors.New("parked")

func newWorld(t *testing.T) *world {
	c := redistest.Start(t).Client()
	w := &world{t: t, c: c, store: New(c), enq: asynq.NewClientFromRedisClient(c), insp: asynq.NewInspectorFromRedisClient(c),
		run: map[string][]time.Time{}, parkAt: map[string]time.Time{}}
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(RecordDequeues(c, "world:holds", worldWorker, func(queue, id string) string { return queue + ":" + id }), asynq.Config{
		Concurrency: 8, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond, DelayedTaskCheckInterval: 50 * time.Millisecond,
		ShutdownTimeout: time.Second,
		IsFailure:       func(err error) bool { return !errors.Is(err, errParked) },
		RetryDelayFunc: func(n int, err error, task *asynq.Task) time.Duration {
			if !errors.Is(err, errParked) {
				return asynq.DefaultRetryDelayFunc(n, err, task)
			}
			id := string(task.Payload())
			now := time.Now()
			w.mu.Lock()
			w.parkAt[id] = now
			w.mu.Unlock()
			if id == "park-soon" {
				return RetryDelay(parkSoon, now)
			}
			return RetryDelay(time.Hour, now)
		},
	})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		w.mu.Lock()
		w.run[id] = append(w.run[id], time.Now())
		n := len(w.run[id])
		w.mu.Unlock()
		switch {
		case n == 1 && strings.HasPrefix(id, "park-"):
			return errParked
		case n == 1 && strings.HasPrefix(id, "hold-"):
			<-release
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(release)
		srv.Shutdown()
		_ = w.enq.Close()
		_ = w.insp.Close()
	})
	return w
}

// enqueue enqueues the task id, its payload its id.
func (w *world) enqueue(id string, opts ...asynq.Option) {
	w.t.Helper()
	if _, err := w.enq.Enqueue(asynq.NewTask("t:world", []byte(id)), append(opts, asynq.TaskID(id))...); err != nil {
		w.t.Fatalf("enqueue %s: %v", id, err)
	}
}

// parked enqueues id ("park-*") and waits until asynq has parked it.
func (w *world) parked(id string, opts ...asynq.Option) {
	w.t.Helper()
	w.enqueue(id, opts...)
	w.waitState(id, "retry retried=0")
}

// active enqueues id ("hold-*") and waits until its handler runs.
func (w *world) active(id string) {
	w.t.Helper()
	w.enqueue(id)
	w.waitState(id, "active retried=0")
}

// completed enqueues id with a retention and waits until asynq completed it.
func (w *world) completed(id string) {
	w.t.Helper()
	w.enqueue(id, asynq.Retention(time.Hour))
	w.waitState(id, "completed retried=0")
}

// state is asynq's state of the task id and its retry count, or "gone".
func (w *world) state(id string) string {
	w.t.Helper()
	info, err := w.insp.GetTaskInfo("default", id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound):
		return "gone"
	case err != nil:
		w.t.Fatal(err)
	}
	return fmt.Sprintf("%s retried=%d", info.State, info.Retried)
}

func (w *world) waitState(id, want string) {
	w.t.Helper()
	redistest.WaitFor(w.t, 10*time.Second, id+" "+want, func() bool { return w.state(id) == want })
}

func (w *world) queue() *asynq.QueueInfo {
	w.t.Helper()
	q, err := w.insp.GetQueueInfo("default")
	if err != nil {
		w.t.Fatal(err)
	}
	return q
}

func (w *world) pause() {
	w.t.Helper()
	if err := w.insp.PauseQueue("default"); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) unpause() {
	w.t.Helper()
	if err := w.insp.UnpauseQueue("default"); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) runs(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.run[id])
}

// ranAt is when the last run of id began.
func (w *world) ranAt(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.run[id]
	if len(r) == 0 {
		w.t.Fatalf("%s never ran", id)
	}
	return r[len(r)-1]
}

func (w *world) parkedAt(id string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.parkAt[id]
}
