package main

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A lock taken with lockstep.WithLock shows in `lockstep locks`, and a second
// WithLock waiting for it (in arrival order, woken by the release) counts
// among its waiters.
func TestLocksCountsWithLockWaiters(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	defer l.Close(context.Background())
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 2)
	go func() {
		done <- l.WithLock(context.Background(), "report:daily", func(context.Context, *lockstep.Lease) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	go func() {
		done <- l.WithLock(context.Background(), "report:daily", func(context.Context, *lockstep.Lease) error { return nil },
			lockstep.Wait(20*time.Second))
	}()
	waitFor(t, 10*time.Second, "one waiter on report:daily in lockstep locks", func() bool {
		v := lockOf(t, srv.Addr, "report:daily")
		return v != nil && v["waiters"] == float64(1)
	})
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
