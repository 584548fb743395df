// Package lifecycle is the one start/stop shape of Lockstep's background
// services: the watchdog, the job server, the scheduler and the metrics
// server each keep their state in a Machine, so they all start and stop the
// same way, and fit an fx lifecycle hook (Start(ctx) error, Stop(ctx) error)
// as they are.
//
//	         Start               Stop                 stop returns
//	New ─────────────▶ Running ─────────▶ Stopping ───────────────▶ Stopped
//	 │ start fails                                                     ▲
//	 ├─────────────────────────────────────────────────────────────────┤
//	 └─────────────────────────────── Stop ────────────────────────────┘
//
// The rules, the same for every service:
//   - Start runs the service's start function once. It must not block: it
//     starts goroutines or a listener and returns, so Start returns at once.
//     A Start while running does nothing and returns nil; a Start after Stop
//     (or after a failed start) returns ErrStopped: a service does not
//     restart. A failed start leaves the service stopped.
//   - Stop runs the service's stop function once, with the caller's context,
//     which bounds how long the stop waits (for handlers, ticks, requests in
//     flight); past it the stop function gives up waiting and returns the
//     context's error. Stop is safe before Start (the service then never
//     starts), safe to repeat, and safe from several goroutines: a Stop that
//     finds another in progress waits for it, bounded by its own context.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// ErrStopped is Start's error once the service was stopped.
var ErrStopped = errors.New("stopped")

// Phase is where a service is in its life.
type Phase int32

// The phases, in the only order a service goes through them.
const (
	New Phase = iota
	Running
	Stopping
	Stopped
)

func (p Phase) String() string {
	switch p {
	case New:
		return "not started"
	case Running:
		return "running"
	case Stopping:
		return "stopping"
	}
	return "stopped"
}

// Machine is one service's start/stop state. The zero value is New.
type Machine struct {
	phase atomic.Int32 // a Phase; written under mu, read without it
	mu    sync.Mutex
	done  chan struct{} // closed on reaching Stopped; guarded by mu
}

// Phase returns the current phase (e.g. for a readiness check).
func (m *Machine) Phase() Phase { return Phase(m.phase.Load()) }

// Running reports whether the service was started and not yet stopped.
func (m *Machine) Running() bool { return m.Phase() == Running }

// Start runs start if the service is new; see the package documentation.
// start runs under the machine's lock, so a concurrent Stop waits for it.
func (m *Machine) Start(start func() error) error {
	if m.Phase() == Running {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.Phase() {
	case Running:
		return nil
	case Stopping, Stopped:
		return ErrStopped
	}
	if err := start(); err != nil {
		m.stopped()
		return err
	}
	m.phase.Store(int32(Running))
	return nil
}

// Stop runs stop(ctx) if the service is running and returns its error; see
// the package documentation.
func (m *Machine) Stop(ctx context.Context, stop func(context.Context) error) error {
	m.mu.Lock()
	switch m.Phase() {
	case New:
		m.stopped()
		m.mu.Unlock()
		return nil
	case Stopping:
		done := m.doneChan()
		m.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case Stopped:
		m.mu.Unlock()
		return nil
	}
	m.phase.Store(int32(Stopping))
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.stopped()
		m.mu.Unlock()
	}()
	return stop(ctx)
}

// stopped moves to Stopped; m.mu is held.
func (m *Machine) stopped() {
	m.phase.Store(int32(Stopped))
	close(m.doneChan())
}

// doneChan returns the channel closed on reaching Stopped; m.mu is held.
func (m *Machine) doneChan() chan struct{} {
	if m.done == nil {
		m.done = make(chan struct{})
	}
	return m.done
}
