// Package tracing is Lockstep's OpenTelemetry tracing: the provider that the
// standard OTEL_* variables configure, the span and attribute names (contracts,
// listed in docs/operations.md), the W3C trace context carried in asynq task headers,
// and the spans of a tick, a job and a hold.
//
// Off costs nothing: a nil *Tracer (what New returns for a nil or no-op
// provider) starts no span, allocates nothing and leaves contexts as they
// are; every method below is safe on it and on a nil *Span.
//
// The tree of one scheduled run, across processes:
//
//	lockstep.tick (internal, scheduler)
//	└── lockstep.enqueue (producer; its context goes in the task's headers)
//	    └── lockstep.job (consumer, worker; one per delivery or hand-off run)
//	        ├── lockstep.lock.wait (until the lock is held, or the task waits elsewhere)
//	        └── lockstep.lock.hold (the handler runs under it; a loss is an event)
//
// The trace context travels only in asynq's task headers, never in the
// payload; a task enqueued without them starts a new trace at its job span.
package tracing
