package jobs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A task whose lock is busy is requeued again and again without its retry
// count growing: with MaxRetry(1), asynq would archive it after the second
// failure, so surviving five contentions proves they did not count.
func TestContentionDoesNotUseRetries(t *testing.T) {
	t.Parallel()
	e, runs := countingEnv(t, "t:locked", "res")
	ctx := context.Background()
	// A holder that lives: a short TTL, renewed ten times as often, so the
	// waiter's fallback backoff (the lock's remaining TTL and a little)
	// brings it back often, and a loaded machine's late renewal does not
	// lose it (at 300 ms it did, beside two other test runs).
	other, err := e.locker.TryAcquire(ctx, "res", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	renewing, stopRenew := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewing)
		for range 600 { // bounded: a minute
			select {
			case <-stopRenew:
				return
			case <-time.After(100 * time.Millisecond):
				_ = other.Renew(ctx)
			}
		}
	}()
	e.enqueue("t:locked", "c1", nil, asynq.MaxRetry(1))

	waitFor(t, 30*time.Second, "five contentions", func() bool { return e.contended("t:locked") >= 5 })
	close(stopRenew)
	<-renewing
	if info := e.info("c1"); info.Retried != 0 || info.State == asynq.TaskStateArchived {
		t.Fatalf("after contention: state %v retried %d, want not archived and 0 retries", info.State, info.Retried)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info := e.completedOnce("c1", runs, 30*time.Second)
	if !strings.Contains(info.LastErr, "busy") {
		t.Fatalf("last error %q does not say the lock was busy", info.LastErr)
	}
	if got := e.contended("t:locked"); got < 5 {
		t.Fatalf("lockstep_job_contended_total = %v, want >= 5", got)
	}
	e.wantProcessed("t:locked", ResultSuccess, 1)
}

// asynq archives a task that errs with no retries left even when the error
// is no failure, so such a task waits for its lock in the worker instead.
func TestContentionWithNoRetriesLeftWaits(t *testing.T) {
	t.Parallel()
	e, runs := countingEnv(t, "t:locked", "res")
	ctx := context.Background()
	other, err := e.locker.TryAcquire(ctx, "res", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.enqueue("t:locked", "w1", nil, asynq.MaxRetry(0))
	waitFor(t, 10*time.Second, "contention", func() bool { return e.contended("t:locked") >= 1 })
	if info := e.info("w1"); info.State != asynq.TaskStateActive {
		t.Fatalf("while the lock is busy: state %v (%s), want active (waiting)", info.State, info.LastErr)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.completedOnce("w1", runs, 10*time.Second)
}

// Deleting the lock key mid-run cancels the handler within one renewal
// interval with a cause matching ErrLockLost; the run counts as failed and is
// retried after the short backoff, not asynq's default of 15s or more.
func TestLockLostCancelsAndRetriesSoon(t *testing.T) {
	t.Parallel()
	started := make(chan Job, 1)
	causes := make(chan error, 1)
	e := newEnv(t, testConfig(), lockedSpec("t:locked", "res", func(ctx context.Context, job Job) error {
		if job.Attempt > 1 {
			return nil
		}
		started <- job
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}))
	ctx := context.Background()
	e.enqueue("t:locked", "l1", nil, asynq.MaxRetry(3))
	job := <-started
	if job.Fence <= 0 || job.Resource != "res" || job.ID != "l1" || job.Attempt != 1 || job.MaxRetry != 3 || job.Queue != "default" {
		t.Fatalf("job = %+v", job)
	}
	deleted := time.Now()
	if err := e.admin.Del(ctx, "lockstep:{res}").Err(); err != nil {
		t.Fatal(err)
	}
	var cause error
	select {
	case cause = <-causes:
	case <-time.After(5 * time.Second):
		t.Fatal("handler context not cancelled after its lock key was deleted")
	}
	interval := testConfig().LockTTL / 3
	if d := time.Since(deleted); d > interval+50*time.Millisecond {
		t.Errorf("cancelled %v after the key was deleted, want within the renewal interval %v", d, interval)
	}
	if !errors.Is(cause, lock.ErrLockLost) {
		t.Fatalf("cause = %v, want ErrLockLost", cause)
	}
	info := e.waitState("l1", asynq.TaskStateCompleted, 10*time.Second)
	if info.Retried != 1 {
		t.Fatalf("retried = %d, want 1 (a lost lock is a failure)", info.Retried)
	}
	if d := info.CompletedAt.Sub(deleted); d > 3*time.Second {
		t.Fatalf("retried run completed %v after the loss, want the short backoff", d)
	}
	e.wantProcessed("t:locked", ResultLockLost, 1)
	losses := e.admin.XRange(ctx, e.locker.LossesKey(), "-", "+").Val()
	if len(losses) != 1 || losses[0].Values["resource"] != "res" || losses[0].Values["reason"] != "expired" ||
		losses[0].Values["task_id"] != "l1" || losses[0].Values["fence"] != strconv.FormatInt(job.Fence, 10) {
		t.Fatalf("losses stream = %v, want one entry for res, reason expired, task l1, fence %d", losses, job.Fence)
	}
}

// A handler that returns nil after its lock was lost (it ignored its
// context, or returned before anyone noticed) is done (G8): the task
// completes after one run, and the loss is counted. Retrying it would only
// repeat its side effects.
func TestReturnAfterLossIsDone(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var admin atomic.Pointer[redis.Client]
	e := newEnv(t, testConfig(), lockedSpec("t:locked", "res", func(ctx context.Context, job Job) error {
		runs.Add(1)
		// The lock is taken by someone else, and the handler does not notice.
		return admin.Load().Set(context.WithoutCancel(ctx), "lockstep:{res}", "another-holder", time.Minute).Err()
	}))
	admin.Store(e.admin)
	e.enqueue("t:locked", "r1", nil, asynq.MaxRetry(3))
	e.completedOnce("r1", &runs, 10*time.Second)
	e.wantProcessed("t:locked", ResultSuccess, 1)
	if got := e.lost("stolen"); got != 1 {
		t.Fatalf("lock_lost_total{stolen} = %v, want 1: the loss must still be counted", got)
	}
	if v := e.admin.Get(context.Background(), "lockstep:{res}").Val(); v != "another-holder" {
		t.Fatalf("the release touched the next holder's lock: %q", v)
	}
}

// A handler that fails after its lock was lost is retried soon and recorded
// lock_lost.
func TestFailureAfterLossIsRetriedAsLockLost(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var admin atomic.Pointer[redis.Client]
	e := newEnv(t, testConfig(), lockedSpec("t:locked", "res", func(ctx context.Context, job Job) error {
		if runs.Add(1) == 1 {
			_ = admin.Load().Del(context.WithoutCancel(ctx), "lockstep:{res}").Err()
			return errors.New("payment provider timed out")
		}
		return nil
	}))
	admin.Store(e.admin)
	e.enqueue("t:locked", "r1", nil, asynq.MaxRetry(3))
	info := e.waitState("r1", asynq.TaskStateCompleted, 10*time.Second)
	if info.Retried != 1 || runs.Load() != 2 {
		t.Fatalf("retried %d after %d runs, want 1 and 2", info.Retried, runs.Load())
	}
	if !strings.Contains(info.LastErr, "lock lost") || !strings.Contains(info.LastErr, "payment provider timed out") {
		t.Fatalf("last error %q does not say the lock was lost and what the handler returned", info.LastErr)
	}
	e.wantProcessed("t:locked", ResultLockLost, 1)
}

// A payload that does not decode is archived at once with the reason.
func TestInvalidPayloadIsArchived(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig(), orderSpec())
	e.enqueue(orderType, "bad-json", []byte(`{"order_id":`), asynq.MaxRetry(5))
	e.enqueue(orderType, "no-order", []byte(`{"work_ms":1}`), asynq.MaxRetry(5))
	for id, want := range map[string]string{"bad-json": "unexpected end of JSON input", "no-order": "order_id is required"} {
		info := e.waitState(id, asynq.TaskStateArchived, 10*time.Second)
		if !strings.Contains(info.LastErr, "invalid payload for "+orderType) || !strings.Contains(info.LastErr, want) {
			t.Errorf("%s: last error %q, want the invalid payload and %q", id, info.LastErr, want)
		}
		if info.Retried != 0 {
			t.Errorf("%s: retried %d, want 0", id, info.Retried)
		}
	}
	e.wantProcessed(orderType, ResultInvalid, 2)
}

// A panicking handler fails its run and its lock is released.
func TestPanicReleasesLock(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	e := newEnv(t, testConfig(), lockedSpec("t:locked", "res", func(context.Context, Job) error {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		return nil
	}))
	e.enqueue("t:locked", "p1", nil, asynq.MaxRetry(3))
	waitFor(t, 10*time.Second, "the panic", func() bool { return e.processed("t:locked", ResultFailure) == 1 })
	if n := e.admin.Exists(context.Background(), "lockstep:{res}").Val(); n != 0 {
		t.Fatal("lock still held after the handler panicked")
	}
	info := e.info("p1")
	if info.Retried != 1 || !strings.Contains(info.LastErr, "panicked: boom") {
		t.Fatalf("after the panic: retried %d, last error %q", info.Retried, info.LastErr)
	}
}

// Stop lets a short handler finish, gives up on a long one after the
// shutdown timeout (its task goes back to the queue), and leaves no lock
// behind, even for a handler that ignores its context.
func TestStopReleasesEveryLock(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.ShutdownTimeout = 500 * time.Millisecond
	started := make(chan string, 3)
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	e := newEnv(t, cfg,
		lockedSpec("t:short", "short", func(ctx context.Context, job Job) error {
			started <- job.ID
			time.Sleep(100 * time.Millisecond)
			return nil
		}),
		lockedSpec("t:long", "long", func(ctx context.Context, job Job) error {
			started <- job.ID
			<-ctx.Done()
			return ctx.Err()
		}),
		lockedSpec("t:stubborn", "stubborn", func(ctx context.Context, job Job) error {
			started <- job.ID
			<-unblock // ignores its context
			return nil
		}),
	)
	e.enqueue("t:short", "short", nil)
	e.enqueue("t:long", "long", nil)
	e.enqueue("t:stubborn", "stubborn", nil)
	for range 3 {
		<-started
	}
	begin := time.Now()
	if err := e.srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > cfg.ShutdownTimeout+100*time.Millisecond {
		t.Errorf("stop took %v, want about the shutdown timeout %v", d, cfg.ShutdownTimeout)
	}
	ctx := context.Background()
	if keys := e.admin.Keys(ctx, "lockstep:{*}").Val(); len(keys) != 0 {
		t.Fatalf("lock keys left after stop: %v", keys)
	}
	if s := e.info("short").State; s != asynq.TaskStateCompleted {
		t.Errorf("short task %v, want completed", s)
	}
	for _, id := range []string{"long", "stubborn"} {
		if info := e.info(id); info.State != asynq.TaskStatePending || info.Retried != 0 {
			t.Errorf("%s task %v with %d retries, want pending again with 0", id, info.State, info.Retried)
		}
	}
}

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	b := backoff.Jitter{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	delay := retryDelay(b)
	contended := &ContendedError{Resource: "r", Ahead: 2, Delay: 30 * time.Millisecond}
	lost := &lostError{lost: &lock.LostError{Key: "r", Reason: lock.ReasonStolen}}
	plain := errors.New("handler failed")
	if isFailure(contended) || !isFailure(lost) || !isFailure(plain) {
		t.Fatal("only contention is no failure")
	}
	for _, err := range []error{contended, lost, asynq.ErrLeaseExpired, &soonError{step: stepLock, err: plain}} {
		if d := delay(0, err, nil); d > 1100*time.Millisecond {
			t.Errorf("%v: delay %v, want the short backoff (under 1.1s)", err, d)
		}
	}
	if d := delay(0, plain, nil); d < 15*time.Second {
		t.Errorf("handler error: delay %v, want asynq's default (15s or more)", d)
	}
}
