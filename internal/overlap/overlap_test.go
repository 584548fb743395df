package overlap_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

const prefix = "lockstep:"

type rig struct {
	t     *testing.T
	srv   *redistest.Server
	insp  *asynq.Inspector
	enq   *asynq.Client
	keys  overlap.Keys
	state string
	locks *lock.Locker // the run locks'
}

func newRig(t *testing.T) *rig {
	t.Helper()
	srv := redistest.Start(t)
	c := srv.Client()
	return &rig{t: t, srv: srv, insp: asynq.NewInspectorFromRedisClient(c), enq: asynq.NewClientFromRedisClient(c),
		keys: overlap.KeysFor(prefix, "s"), state: prefix + "{schedule:s}:state", locks: lock.New(c, lock.WithPrefix(prefix))}
}

// tick applies policy to the tick whose task id is id, with grace for runs
// not yet in asynq.
func (r *rig) tick(policy config.Overlap, id string, grace time.Duration) overlap.Decision {
	r.t.Helper()
	d, err := overlap.Tick(context.Background(), r.srv.Client(), r.insp, r.locks, r.keys, r.state, policy, "default", id, grace, time.Hour)
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

func (r *rig) enqueue(id string) {
	r.t.Helper()
	if _, err := r.enq.Enqueue(asynq.NewTask("t", nil), asynq.TaskID(id)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) runs() map[string]string {
	r.t.Helper()
	m, err := r.srv.Client().HGetAll(context.Background(), r.keys.Runs).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// A run that waits in a long backlog (pending in asynq) is live however
// old; once asynq no longer has its task, it has ended and the next tick runs.
func TestSkipWhileTheRunIsQueued(t *testing.T) {
	r := newRig(t)
	if d := r.tick(config.OverlapSkip, "s:100", 0); !d.Run {
		t.Fatalf("first tick: %+v, want run", d)
	}
	r.enqueue("s:100")
	if d := r.tick(config.OverlapSkip, "s:101", 0); d.Run || d.Queued != 1 {
		t.Fatalf("tick behind a pending run: %+v, want skipped with 1 queued", d)
	}
	if _, ok := r.runs()["s:101"]; ok {
		t.Error("a skipped tick was registered as a run")
	}
	if err := r.insp.DeleteTask("default", "s:100"); err != nil {
		t.Fatal(err)
	}
	if d := r.tick(config.OverlapSkip, "s:102", 0); !d.Run {
		t.Fatalf("tick after the run's task is gone: %+v, want run", d)
	}
	if runs := r.runs(); len(runs) != 1 || runs["s:102"] == "" {
		t.Errorf("runs %v, want only s:102", runs)
	}
}

// A run registered and not yet enqueued is live while its tick is pending
// (its leader is enqueueing it), and for the grace after that.
func TestSkipWhileTheRunIsBeingEnqueued(t *testing.T) {
	r := newRig(t)
	c := r.srv.Client()
	ctx := context.Background()
	r.tick(config.OverlapSkip, "s:100", 0)
	c.HSet(ctx, r.state, "p:100", "0 token")
	if d := r.tick(config.OverlapSkip, "s:101", 0); d.Run {
		t.Fatalf("tick behind a run being enqueued: %+v, want skipped", d)
	}
	c.HDel(ctx, r.state, "p:100")
	if d := r.tick(config.OverlapSkip, "s:101", time.Minute); d.Run {
		t.Fatalf("tick within the grace: %+v, want skipped", d)
	}
	if d := r.tick(config.OverlapSkip, "s:101", 0); !d.Run {
		t.Fatalf("tick after the grace, the run's task never enqueued: %+v, want run", d)
	}
}

// buffer_one lets one run wait, not two.
func TestBufferOne(t *testing.T) {
	r := newRig(t)
	for i, want := range []bool{true, false} {
		id := "s:" + string(rune('0'+i))
		if d := r.tick(config.OverlapBufferOne, id, time.Minute); d.Run != want {
			t.Errorf("tick %d: %+v, want run %v", i, d, want)
		}
	}
}

// A worker begins a run only while it is registered; cancel_previous ends
// the running run's hold of the run lock through the lock, which hands it
// to whoever waits for it (else the key goes), so its watchdog cancels it,
// and the run no longer is one.
func TestCancelPreviousEndsTheRunningRun(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.srv.Client()
	l := r.locks
	if _, err := overlap.Begin(ctx, c, l, r.keys, "s:100", time.Minute); err != overlap.ErrEnded {
		t.Fatalf("begin of an unregistered run: %v, want ErrEnded", err)
	}
	r.tick(config.OverlapCancelPrevious, "s:100", time.Minute)
	run, err := overlap.Begin(ctx, c, l, r.keys, "s:100", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if run.Lease.RedisKey() != r.keys.Lock || r.runs()["s:100"] != "r" {
		t.Fatalf("run lock %s, runs %v; want %s held and s:100 running", run.Lease.RedisKey(), r.runs(), r.keys.Lock)
	}
	r.enqueue("s:100") // without its task in asynq, the run would have ended
	waiter := make(chan *lock.Lease, 1)
	go func() { // someone waiting for the run lock (its retry is far away)
		lease, err := l.Acquire(ctx, r.keys.Resource, time.Minute, lock.WithWaitBackoff(backoff.Jitter{Min: time.Minute, Max: time.Minute}))
		if err != nil {
			t.Error(err)
		}
		waiter <- lease
	}()
	redistest.WaitFor(t, 5*time.Second, "a waiter for the run lock", func() bool {
		h, err := l.Held(ctx, r.keys.Resource)
		return err == nil && h != nil && h.Queued == 1
	})
	d := r.tick(config.OverlapCancelPrevious, "s:101", time.Minute)
	if !d.Run || d.Cancelled != 1 {
		t.Fatalf("cancel_previous: %+v, want run with 1 cancelled", d)
	}
	select {
	case w := <-waiter:
		if w == nil || w.Fence() <= run.Lease.Fence() {
			t.Fatalf("the waiter was handed %v, want the run lock with a fence above the cancelled run's %d", w, run.Lease.Fence())
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel_previous did not hand the run lock to its waiter")
	}
	var lostErr *lock.LostError
	if err := run.Lease.Renew(ctx); !errors.As(err, &lostErr) {
		t.Errorf("the cancelled run's renewal: %v, want its lock lost", err)
	}
	// The loss of its run lock is explained: the cause names the new tick.
	lost := &lock.LostError{Key: "schedule:s", Reason: lock.ReasonExpired}
	wantCause(t, run.Cancelled(lost, time.Second), lost, "s:101", time.Unix(101, 0))
	if live, err := run.Finish(ctx, false); err != nil || live {
		t.Fatalf("finish of the cancelled run: live %v, %v; want not live", live, err)
	}
	if runs := r.runs(); len(runs) != 1 || runs["s:101"] == "" {
		t.Errorf("runs %v, want only s:101", runs)
	}
	// A trigger cancels too, named with the time in its task id.
	next, err := overlap.Begin(ctx, c, l, r.keys, "s:101", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r.enqueue("s:101")
	r.tick(config.OverlapCancelPrevious, "s:trigger:101500-0a1b2c3d", time.Minute)
	wantCause(t, next.Cancelled(lost, time.Second), lost, "s:trigger:101500-0a1b2c3d", time.UnixMilli(101500))
	if err := next.Cancelled(&lock.LostError{Key: "schedule:s", Reason: lock.ReasonUnreachable}, time.Second); err != nil {
		t.Errorf("an unreachable run lock explained as %v, want nil (no tick took it)", err)
	}
}

// wantCause checks that cause is an overlap.CancelledError by the tick of
// task id by at tick, wrapping lost.
func wantCause(t *testing.T, cause error, lost *lock.LostError, by string, tick time.Time) {
	t.Helper()
	var c *overlap.CancelledError
	var l *lock.LostError
	switch {
	case !errors.As(cause, &c) || c.By != by || !c.Tick.Equal(tick):
		t.Errorf("cause %v, want one naming tick %s at %v", cause, by, tick)
	case !errors.Is(cause, lock.ErrLockLost) || !errors.As(cause, &l) || l != lost:
		t.Errorf("cause %v does not wrap the run lock's loss %v", cause, lost)
	case !strings.Contains(cause.Error(), "cancelled by tick "+by+" at "+tick.UTC().Format(time.RFC3339)):
		t.Errorf("cause %q does not name tick %s", cause, by)
	}
}
