package watchdog

import (
	"context"
	"time"
)

// epoch is the base of Hold.deadlineNs: time.Since(epoch) reads the
// monotonic clock, which keeps counting while the process is stopped.
var epoch = time.Now()

func (h *Hold) setDeadline(d time.Time) { h.deadlineNs.Store(int64(d.Sub(epoch))) }

// checkAtUse ends the hold (reason unreachable) when its local deadline has
// passed, whether or not the deadline timer has run yet. A process resumed
// after a pause longer than the deadline thus sees its context done at its
// first check, even while the overdue timer still waits to be scheduled.
func (h *Hold) checkAtUse() {
	if int64(time.Since(epoch)) >= h.deadlineNs.Load() {
		h.onDeadline()
	}
}

// leaseContext is the context a Hold hands to its holder. Every Err, Done,
// and Value call (context.Cause goes through Value) first checks the local
// deadline, so the lease is checked at use, not only when a timer fires.
//
// Contexts derived from it (WithTimeout, ...) hang on its cancellation, so
// they see the loss once the check has run on the hold's context or the
// timer has fired; checks on the hold's own context are immediate.
type leaseContext struct {
	context.Context // the cancel-cause context the watchdog cancels
	h               *Hold
}

func (c *leaseContext) Err() error {
	c.h.checkAtUse()
	return c.Context.Err()
}

func (c *leaseContext) Done() <-chan struct{} {
	c.h.checkAtUse()
	return c.Context.Done()
}

func (c *leaseContext) Value(key any) any {
	if key == (holdKey{}) {
		return c.h // Progress: no check needed
	}
	c.h.checkAtUse()
	return c.Context.Value(key)
}

// holdKey is the context key under which a hold's context answers its Hold.
type holdKey struct{}
