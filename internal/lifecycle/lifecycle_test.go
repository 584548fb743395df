package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestStartOnceStopOnce(t *testing.T) {
	t.Parallel()
	var m lifecycle.Machine
	starts, stops := 0, 0
	start := func() error { starts++; return nil }
	stop := func(context.Context) error { stops++; return nil }
	if m.Phase() != lifecycle.New || m.Running() {
		t.Fatalf("zero Machine: %v", m.Phase())
	}
	for range 2 {
		if err := m.Start(start); err != nil {
			t.Fatalf("Start = %v", err)
		}
	}
	if starts != 1 || !m.Running() {
		t.Fatalf("after two Starts: %d starts, %v", starts, m.Phase())
	}
	for range 2 {
		if err := m.Stop(t.Context(), stop); err != nil {
			t.Fatalf("Stop = %v", err)
		}
	}
	if stops != 1 || m.Phase() != lifecycle.Stopped {
		t.Fatalf("after two Stops: %d stops, %v", stops, m.Phase())
	}
	if err := m.Start(start); !errors.Is(err, lifecycle.ErrStopped) || starts != 1 {
		t.Fatalf("Start after Stop = %v (%d starts), want ErrStopped", err, starts)
	}
}

func TestStopBeforeStart(t *testing.T) {
	t.Parallel()
	var m lifecycle.Machine
	if err := m.Stop(t.Context(), func(context.Context) error { t.Error("stop ran before any start"); return nil }); err != nil {
		t.Fatalf("Stop before Start = %v", err)
	}
	if err := m.Start(func() error { t.Error("start ran after Stop"); return nil }); !errors.Is(err, lifecycle.ErrStopped) {
		t.Fatalf("Start after Stop = %v, want ErrStopped", err)
	}
}

func TestFailedStartLeavesStopped(t *testing.T) {
	t.Parallel()
	var m lifecycle.Machine
	bad := errors.New("address in use")
	if err := m.Start(func() error { return bad }); err != bad {
		t.Fatalf("Start = %v, want the start function's error", err)
	}
	if m.Phase() != lifecycle.Stopped {
		t.Fatalf("after a failed start: %v", m.Phase())
	}
	if err := m.Stop(t.Context(), func(context.Context) error { t.Error("stop ran after a failed start"); return nil }); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if err := m.Start(func() error { return nil }); !errors.Is(err, lifecycle.ErrStopped) {
		t.Fatalf("second Start = %v, want ErrStopped", err)
	}
}

// A Stop that finds another in progress waits for it, bounded by its own
// context; the stop function's error is the first Stop's.
func TestConcurrentStopWaitsBounded(t *testing.T) {
	t.Parallel()
	var m lifecycle.Machine
	if err := m.Start(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	failed := errors.New("handlers still running")
	first := make(chan error, 1)
	go func() {
		first <- m.Stop(context.Background(), func(context.Context) error {
			close(entered)
			<-release
			return failed
		})
	}()
	<-entered
	if m.Phase() != lifecycle.Stopping || m.Running() {
		t.Fatalf("during stop: %v", m.Phase())
	}
	noStop := func(context.Context) error { t.Error("stop ran twice"); return nil }
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := m.Stop(short, noStop); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Stop while the first runs = %v, want its context's error", err)
	}
	second := make(chan error, 1)
	go func() { second <- m.Stop(context.Background(), noStop) }()
	close(release)
	if err := <-first; err != failed {
		t.Fatalf("first Stop = %v, want the stop function's error", err)
	}
	if err := redistest.Receive(t, second, 10*time.Second, "the waiting Stop to return after the first finished"); err != nil {
		t.Fatalf("waiting Stop = %v", err)
	}
}

// Stop hands its context to the stop function, which bounds the wait.
func TestStopPassesContext(t *testing.T) {
	t.Parallel()
	var m lifecycle.Machine
	_ = m.Start(func() error { return nil })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := m.Stop(ctx, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with a cancelled context = %v", err)
	}
}
