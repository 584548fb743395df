package lockstep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
)

// WithLock with Permits(3): three callers hold the key at once on permits
// 0, 1 and 2, a fourth is busy (or waits and is handed the first permit
// released), and a permit overwritten in Redis cancels its holder alone, at
// once (the server's notice: the 30s TTL's next renewal is 10s away).
func TestWithLockPermits(t *testing.T) {
	t.Parallel()
	l, admin := newLocker(t)
	ctx := context.Background()
	type holder struct {
		lease  *lockstep.Lease
		cancel <-chan error // fn's context's cause when it ended
	}
	entered := make(chan holder, 3)
	release := make(chan struct{})
	done := make(chan error, 3)
	for range 3 {
		go func() {
			done <- l.WithLock(ctx, "tenant", func(ctx context.Context, lease *lockstep.Lease) error {
				cause := make(chan error, 1)
				entered <- holder{lease, cause}
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
					return ctx.Err()
				case <-release:
					return nil
				}
			}, lockstep.Permits(3), lockstep.TTL(30*time.Second))
		}()
	}
	byPermit := map[int]holder{}
	for range 3 {
		h := <-entered
		byPermit[h.lease.Permit()] = h
	}
	if len(byPermit) != 3 {
		t.Fatalf("permits %v, want 0, 1 and 2", byPermit)
	}
	err := l.WithLock(ctx, "tenant", func(context.Context, *lockstep.Lease) error { return nil }, lockstep.Permits(3))
	if !errors.Is(err, lockstep.ErrNotAcquired) {
		t.Fatalf("a fourth caller: %v, want ErrNotAcquired", err)
	}
	if err := admin.Set(ctx, "lockstep:{tenant}:p1", "thief", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-byPermit[1].cancel:
		var lost *lockstep.LostError
		if !errors.As(cause, &lost) || lost.Reason != lockstep.ReasonStolen {
			t.Fatalf("permit 1's holder ended with %v, want stolen", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("permit 1's holder not cancelled after its key was overwritten")
	}
	if err := <-done; !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("permit 1's WithLock = %v, want ErrLockLost", err)
	}
	// Permit 1 is the thief's now; 0 and 2 still run. A waiter gets the
	// first one released.
	got := make(chan int, 1)
	go func() {
		_ = l.WithLock(ctx, "tenant", func(_ context.Context, lease *lockstep.Lease) error {
			got <- lease.Permit()
			return nil
		}, lockstep.Permits(3), lockstep.Wait(10*time.Second))
	}()
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if k := <-got; k != 0 && k != 2 {
		t.Fatalf("the waiter got permit %d, want a released one (0 or 2)", k)
	}
	if err := l.WithLock(ctx, "bad", func(context.Context, *lockstep.Lease) error { return nil }, lockstep.Permits(0)); err == nil {
		t.Fatal("Permits(0) accepted")
	}
}
