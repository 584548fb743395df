package tracing

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope of every Lockstep span.
const ScopeName = "github.com/lockstep-dev/lockstep"

// Span names (contracts: docs/operations.md, Tracing).
const (
	SpanTick     = "lockstep.tick"
	SpanEnqueue  = "lockstep.enqueue"
	SpanJob      = "lockstep.job"
	SpanLockWait = "lockstep.lock.wait"
	SpanLockHold = "lockstep.lock.hold"
	// EventLockLost is the hold span's event for a lost lock, with
	// AttrReason.
	EventLockLost = "lockstep.lock.lost"
)

// Attribute keys (contracts). The messaging.* keys follow the OpenTelemetry
// semantic conventions for messaging.
const (
	AttrSchedule  = attribute.Key("lockstep.schedule")
	AttrTick      = attribute.Key("lockstep.tick") // RFC 3339, UTC
	AttrReplica   = attribute.Key("lockstep.replica")
	AttrOutcome   = attribute.Key("lockstep.outcome")
	AttrTaskID    = attribute.Key("lockstep.task_id")
	AttrTaskType  = attribute.Key("lockstep.task_type")
	AttrAttempt   = attribute.Key("lockstep.attempt")
	AttrResource  = attribute.Key("lockstep.resource")
	AttrFence     = attribute.Key("lockstep.fence")
	AttrPermit    = attribute.Key("lockstep.permit")
	AttrHandedOff = attribute.Key("lockstep.handed_off")
	AttrPosition  = attribute.Key("lockstep.position") // waiters ahead on arrival, 0 = first in line
	AttrReason    = attribute.Key("lockstep.reason")   // a loss's reason: stolen, expired, ...

	AttrMessagingSystem      = attribute.Key("messaging.system")
	AttrMessagingOperation   = attribute.Key("messaging.operation.type")
	AttrMessagingDestination = attribute.Key("messaging.destination.name")
	AttrMessagingMessageID   = attribute.Key("messaging.message.id")
)

// Values of AttrOutcome on a tick span.
const (
	TickEnqueued  = "enqueued"   // this replica won the tick and enqueued it
	TickFollower  = "follower"   // another replica had the tick
	TickTakenOver = "taken_over" // enqueued by this replica after the first claimer died
	TickCaughtUp  = "caught_up"  // enqueued late by the catch-up policy
	TickSkipped   = "skipped"    // dropped by the catch-up policy
	TickDuplicate = "duplicate"  // won, but its task id existed already
	TickMissed    = "missed"     // pending too long to take over safely; dropped
	TickEarly     = "early"      // not claimed: this replica's clock is ahead of Redis
)

// Values of AttrOutcome on a wait span (besides the job's, when the wait
// ended the job's delivery).
const (
	WaitAcquired    = "acquired"     // the lock is held: a hold span follows
	WaitRequeued    = "requeued"     // the task waits among the resource's waiters, out of the worker
	WaitNotAcquired = "not_acquired" // WithLock: busy after the wait, if any (ErrNotAcquired)
	WaitFailed      = "error"        // the back end did not answer; the span's status says why
)

// Values of AttrOutcome on a hold span.
const (
	HoldReleased  = "released"
	HoldHandedOff = "handed_off" // the release gave the lock to the next waiter
	HoldLost      = "lost"       // with AttrReason
)

const messagingSystem = "asynq"
