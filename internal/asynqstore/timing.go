package asynqstore

import (
	"context"
	"time"
)

// asynq's timings (v0.26.0) that Lockstep's own bounds follow.

// Redelivery bounds how long after its worker died asynq delivers an active
// task again: its lease (30 s, extended every 5 s), the period of its
// recoverer (1 min, which also runs at start) and the slack the recoverer
// leaves after a lease has passed (30 s).
const Redelivery = 2 * time.Minute

// Lease is how far ahead asynq sets an active task's lease when it
// delivers the task, and again at each heartbeat of the server running it
// (base.LeaseDuration).
const Lease = 30 * time.Second

// RetryDelay returns the delay to give asynq's RetryDelayFunc for a task
// that must not come back before now+d: a delay d' such that the task asynq
// schedules at now+d' becomes ready no earlier than now+d.
//
// asynq keeps the time of a retry as a score in whole Unix seconds
// (processAt.Unix(), truncated) and forwards a task once the score is not
// after the current second. A delay of 300ms may therefore come back at once,
// which for contention would mean spinning on the busy lock. Rounding the
// ready time up to the next whole second keeps every delay at least as long
// as asked for, at the cost of under one second of extra wait. The 10ms
// margin keeps asynq's own time.Now(), read a moment later, inside the same
// second.
func RetryDelay(d time.Duration, now time.Time) time.Duration {
	ready := now.Add(d)
	sec := ready.Truncate(time.Second)
	if sec.Before(ready) {
		sec = sec.Add(time.Second)
	}
	return sec.Sub(now) + 10*time.Millisecond
}

// Context bounds a run of the task by its own timeout and deadline, as
// asynq's processor does for a task it delivers: the timeout counts from
// now, the deadline is absolute, and the earlier of the two wins. asynq's
// client gives every task one of them; a task with neither is bounded only
// by ctx.
func (m TaskMsg) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	var d time.Time
	if m.Timeout > 0 {
		d = time.Now().Add(time.Duration(m.Timeout) * time.Second)
	}
	if m.Deadline > 0 {
		if dl := time.Unix(m.Deadline, 0); d.IsZero() || dl.Before(d) {
			d = dl
		}
	}
	if d.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, d)
}
