package lockstep_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

func newLocker(t *testing.T) (*lockstep.Locker, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	c := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	l := lockstep.NewLocker(c)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, srv.Client()
}

// WithLock runs fn once under the lock, returns what fn returns (no lock
// loss when there was none) and releases the lock, whether fn succeeded or
// failed.
func TestWithLockRunsFnOnceAndReleases(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := context.Background()
	for _, want := range []error{nil, errors.New("boom")} {
		var runs int
		err := l.WithLock(ctx, "job", func(ctx context.Context, lease *lockstep.Lease) error {
			runs++
			if got := admin.Get(ctx, "lockstep:{job}").Val(); got != lease.Token() {
				t.Errorf("during fn the lock key holds %q, want the lease token", got)
			}
			if lease.Fence() <= 0 || lease.Key() != "job" {
				t.Errorf("lease key %q fence %d", lease.Key(), lease.Fence())
			}
			return want
		})
		if !errors.Is(err, want) || (want == nil) != (err == nil) || errors.Is(err, lockstep.ErrLockLost) || runs != 1 {
			t.Fatalf("WithLock = %v after %d runs, want fn's %v after 1 and no lock loss", err, runs, want)
		}
		if n := admin.Exists(ctx, "lockstep:{job}").Val(); n != 0 {
			t.Fatalf("lock not released after fn returned %v", want)
		}
	}
}

func TestWithLockBusyFailsAtOnceOrWaits(t *testing.T) {
	t.Parallel()
	l, _ := newLocker(t)
	ctx := context.Background()
	inside := make(chan struct{})
	leave := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error {
			close(inside)
			<-leave
			return nil
		})
	}()
	<-inside

	start := time.Now()
	err := l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error {
		t.Error("fn ran while another caller held the lock")
		return nil
	})
	if !errors.Is(err, lockstep.ErrNotAcquired) {
		t.Fatalf("busy lock without wait: %v, want ErrNotAcquired", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("busy lock without wait took %v", d)
	}

	var ran atomic.Bool
	second := make(chan error, 1)
	go func() {
		second <- l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error {
			ran.Store(true)
			return nil
		}, lockstep.Wait(10*time.Second), lockstep.Backoff(time.Millisecond, 20*time.Millisecond))
	}()
	close(leave)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil || !ran.Load() {
		t.Fatalf("waiting caller: %v, ran=%v; want it to run after the first released", err, ran.Load())
	}

	// A wait that ends before the holder releases gives up with ErrNotAcquired.
	hold := make(chan struct{})
	held := make(chan struct{})
	go func() {
		_ = l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error { close(held); <-hold; return nil })
	}()
	<-held
	defer close(hold)
	if err := l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error { return nil },
		lockstep.Wait(200*time.Millisecond)); !errors.Is(err, lockstep.ErrNotAcquired) {
		t.Fatalf("wait past the bound: %v, want ErrNotAcquired", err)
	}
}

func TestWithLockPanicReleasesAndRepanics(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := context.Background()
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want the fn's panic re-raised", r)
			}
		}()
		_ = l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error { panic("kaboom") })
		t.Fatal("WithLock returned after fn panicked")
	}()
	if n := admin.Exists(ctx, "lockstep:{job}").Val(); n != 0 {
		t.Fatal("lock not released after fn panicked")
	}
	if err := l.WithLock(ctx, "job", func(context.Context, *lockstep.Lease) error { return nil }); err != nil {
		t.Fatalf("lock unusable after a panic: %v", err)
	}
}

func TestWithLockStolenCancelsFnAndReportsLoss(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := context.Background()
	err := l.WithLock(ctx, "job", func(ctx context.Context, lease *lockstep.Lease) error {
		if err := admin.Set(ctx, "lockstep:{job}", "thief", time.Minute).Err(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			var lost *lockstep.LostError
			if !errors.As(context.Cause(ctx), &lost) || lost.Reason != "stolen" {
				t.Errorf("cause %v, want a stolen LostError", context.Cause(ctx))
			}
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("fn's context was not cancelled after the lock was stolen")
		}
		// A 30s TTL: the next renewal is 10s away, so only the server's
		// notice can cancel fn within the 5s above.
	}, lockstep.TTL(30*time.Second))
	if !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("WithLock = %v, want an error matching ErrLockLost", err)
	}
	if got := admin.Get(ctx, "lockstep:{job}").Val(); got != "thief" {
		t.Fatalf("release touched the new holder's lock: key holds %q", got)
	}
}

// fn that returns nil is done, even though its lock was lost while it ran
// (it ignored its context): WithLock returns nil, and the lease says it was
// lost, for a caller that wants to know. Retrying would repeat fn's work.
func TestWithLockNilAfterLossIsDone(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := context.Background()
	var held *lockstep.Lease
	err := l.WithLock(ctx, "paid", func(ctx context.Context, lease *lockstep.Lease) error {
		held = lease
		return admin.Set(ctx, "lockstep:{paid}", "thief", time.Minute).Err()
	})
	if err != nil {
		t.Fatalf("WithLock = %v, want nil: fn finished", err)
	}
	if lost := held.Lost(); lost == nil || lost.Reason != "stolen" {
		t.Fatalf("lease.Lost() = %v, want the stolen loss", lost)
	}
	// An error after a loss matches both ErrLockLost and fn's error.
	failed := errors.New("provider down")
	err = l.WithLock(ctx, "paid2", func(ctx context.Context, lease *lockstep.Lease) error {
		_ = admin.Del(ctx, "lockstep:{paid2}").Err()
		return failed
	})
	if !errors.Is(err, lockstep.ErrLockLost) || !errors.Is(err, failed) {
		t.Fatalf("WithLock = %v, want an error matching ErrLockLost and fn's error", err)
	}
	// A clean run reports no loss.
	if err := l.WithLock(ctx, "clean", func(ctx context.Context, lease *lockstep.Lease) error { held = lease; return nil }); err != nil || held.Lost() != nil {
		t.Fatalf("clean run: %v, lost %v", err, held.Lost())
	}
}

func TestWithLockReentrantForOneOwner(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := lockstep.WithOwner(context.Background(), "migration-1")
	err := l.WithLock(ctx, "db", func(ctx context.Context, outer *lockstep.Lease) error {
		return l.WithLock(ctx, "db", func(ctx context.Context, inner *lockstep.Lease) error {
			if inner.Fence() != outer.Fence() {
				t.Errorf("inner fence %d, outer %d", inner.Fence(), outer.Fence())
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("nested WithLock for one owner: %v", err)
	}
	if n := admin.Exists(context.Background(), "lockstep:{db}").Val(); n != 0 {
		t.Fatal("lock not released after the outer call")
	}
}

// A WithLock function stuck in a call that ignores its context, under
// StallAfter, is given up once it reported no Progress for that long: a
// waiting caller holds the lock then (not after its 30 s TTL), with a
// higher fence, and the stuck function's context ends with ErrLockLost,
// reason stalled; a function that reports Progress keeps its hold past the
// bound; MaxHold gives a hold up whatever its progress, counted from the
// acquire (so from before the WithLock call here).
func TestWithLockStallAfterAndMaxHoldHandOn(t *testing.T) {
	t.Parallel()
	l, _ := newLocker(t)
	ctx := context.Background()
	const bound = 300 * time.Millisecond
	for _, c := range []struct {
		name   string
		opt    lockstep.LockOption
		reason lockstep.Reason
	}{{"stalled", lockstep.StallAfter(bound), lockstep.ReasonStalled}, {"max_hold", lockstep.MaxHold(bound), lockstep.ReasonMaxHold}} {
		resource := "stuck:" + c.name
		held, wake := make(chan int64, 1), make(chan struct{})
		var lastProgress atomic.Int64
		lastProgress.Store(time.Now().UnixNano()) // MaxHold's start: before the acquire
		done := make(chan error, 1)
		go func() {
			done <- l.WithLock(ctx, resource, func(ctx context.Context, lease *lockstep.Lease) error {
				if c.reason == lockstep.ReasonStalled {
					lockstep.Progress(ctx)
					lastProgress.Store(time.Now().UnixNano())
				}
				held <- lease.Fence()
				<-wake // ignores ctx
				return context.Cause(ctx)
			}, c.opt)
		}()
		fence := <-held
		var next int64
		err := l.WithLock(ctx, resource, func(_ context.Context, lease *lockstep.Lease) error {
			next = lease.Fence()
			return nil
		}, lockstep.Wait(10*time.Second), lockstep.Backoff(5*time.Second, 5*time.Second))
		after := time.Since(time.Unix(0, lastProgress.Load()))
		close(wake)
		var lost *lockstep.LostError
		if err != nil || next <= fence {
			t.Errorf("%s: the waiter: %v, fence %d (the stuck holder's %d)", c.name, err, next, fence)
		}
		if after < bound || after > bound+2*time.Second {
			t.Errorf("%s: the waiter held the lock %v after the stuck holder's last progress (stalled) or the call (max_hold), want from %v to %v",
				c.name, after, bound, bound+2*time.Second)
		}
		if err := <-done; !errors.As(err, &lost) || lost.Reason != c.reason {
			t.Errorf("%s: the stuck holder ended with %v, want lost (%s)", c.name, err, c.reason)
		}
	}

	// Progress every 100 ms for a second under StallAfter(1s): held
	// throughout (a loaded machine may delay a step by most of the bound).
	err := l.WithLock(ctx, "steady", func(ctx context.Context, _ *lockstep.Lease) error {
		for range 10 {
			lockstep.Progress(ctx)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	}, lockstep.StallAfter(time.Second))
	if err != nil {
		t.Errorf("a function reporting progress under StallAfter: %v", err)
	}
}
