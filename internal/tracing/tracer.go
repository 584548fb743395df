package tracing

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Tracer starts Lockstep's spans. A nil *Tracer is tracing off.
type Tracer struct{ t trace.Tracer }

// New returns a Tracer over tp, or nil (off) when tp is nil or a no-op
// provider.
func New(tp trace.TracerProvider) *Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName)}
}

// Span is a started span; a nil *Span does nothing.
type Span struct{ s trace.Span }

// Outcome sets the span's lockstep.outcome.
func (s *Span) Outcome(o string) {
	if s != nil {
		s.s.SetAttributes(AttrOutcome.String(o))
	}
}

// Fail marks the span failed with err.
func (s *Span) Fail(err error) {
	if s != nil && err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
}

// End ends the span.
func (s *Span) End() {
	if s != nil {
		s.s.End()
	}
}

// StartTick starts the span of one tick of schedule on replica: the root of
// the tick's trace.
func (t *Tracer) StartTick(ctx context.Context, schedule string, tick time.Time, replica string) (context.Context, *Span) {
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.t.Start(ctx, SpanTick, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			AttrSchedule.String(schedule),
			AttrTick.String(tick.UTC().Format(time.RFC3339)),
			AttrReplica.String(replica),
		))
	return ctx, &Span{s}
}

// StartEnqueue starts the producer span of enqueuing task id into queue and
// returns the headers that carry its context to the worker.
func (t *Tracer) StartEnqueue(ctx context.Context, queue, id string) (context.Context, *Span, map[string]string) {
	if t == nil {
		return ctx, nil, nil
	}
	ctx, s := t.t.Start(ctx, SpanEnqueue, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			AttrMessagingSystem.String(messagingSystem),
			AttrMessagingOperation.String("send"),
			AttrMessagingDestination.String(queue),
			AttrMessagingMessageID.String(id),
			AttrTaskID.String(id),
		))
	return ctx, &Span{s}, Inject(ctx)
}

// Job is the task being run in ctx: a job span and the wait for its lock.
type Job struct {
	span Span
	wait *Wait
}

type jobKey struct{}

// JobRun names one run of a task.
type JobRun struct {
	ID, Type, Queue string
	Attempt         int
	Headers         map[string]string // the task's asynq headers: the trace context of its enqueue
	HandedOnBy      trace.SpanContext // the run that handed the lock on to this one, if any: a link
}

// StartJob starts the consumer span of one run of a task, a child of the
// trace context in its headers (a new trace without them). With tracing
// off it only puts that context in ctx, so that a handler's own spans join
// the tick's trace.
func (t *Tracer) StartJob(ctx context.Context, r JobRun) (context.Context, *Job) {
	if t == nil {
		if len(r.Headers) > 0 {
			ctx = Extract(ctx, r.Headers)
		}
		return ctx, nil
	}
	// A run belongs to its task's trace, not to the run that handed it on
	// (that is a link): without headers it starts a trace of its own.
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	if len(r.Headers) > 0 {
		ctx = Extract(ctx, r.Headers)
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			AttrMessagingSystem.String(messagingSystem),
			AttrMessagingOperation.String("process"),
			AttrMessagingDestination.String(r.Queue),
			AttrMessagingMessageID.String(r.ID),
			AttrTaskID.String(r.ID),
			AttrTaskType.String(r.Type),
			AttrAttempt.Int(r.Attempt),
		)}
	if r.HandedOnBy.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: r.HandedOnBy,
			Attributes: []attribute.KeyValue{AttrHandedOff.Bool(true)}}))
	}
	ctx, s := t.t.Start(ctx, SpanJob, opts...)
	j := &Job{span: Span{s}}
	return context.WithValue(ctx, jobKey{}, j), j
}

// End ends the job span with outcome, and its wait if that is still open
// (the run ended without holding the lock) with the same outcome.
func (j *Job) End(outcome string, err error) {
	if j == nil {
		return
	}
	if j.wait != nil {
		j.wait.End(outcome)
	}
	j.span.Outcome(outcome)
	j.span.Fail(err)
	j.span.End()
}

// Waited reports whether the job waited for its lock without holding it.
func (j *Job) Waited() bool { return j != nil && j.wait != nil && !j.wait.held }

// Wait is the span of a wait for a lock.
type Wait struct {
	span      trace.Span
	busy      bool
	handedOff bool
	held      bool
	ended     bool
}

type waitKey struct{}

// StartWait starts the span of the wait for resource's lock, a sibling of
// the hold that follows it; ctx then carries it (not as its current span)
// for WaitBusy, WaitGranted and StartHold.
func (t *Tracer) StartWait(ctx context.Context, resource string) (context.Context, *Wait) {
	if t == nil {
		return ctx, nil
	}
	_, s := t.t.Start(ctx, SpanLockWait, trace.WithAttributes(AttrResource.String(resource)))
	w := &Wait{span: s}
	if j, _ := ctx.Value(jobKey{}).(*Job); j != nil {
		j.wait = w
	}
	return context.WithValue(ctx, waitKey{}, w), w
}

func (t *Tracer) waitOf(ctx context.Context) *Wait {
	if t == nil {
		return nil
	}
	w, _ := ctx.Value(waitKey{}).(*Wait)
	return w
}

// WaitBusy records that the lock of the wait in ctx was busy, with ahead
// waiters before this one (the position on arrival; the first call counts).
func (t *Tracer) WaitBusy(ctx context.Context, ahead int) { t.waitOf(ctx).Busy(ahead) }

// WaitGranted records that the lock of the wait in ctx came by a hand-off
// from its previous holder.
func (t *Tracer) WaitGranted(ctx context.Context) { t.waitOf(ctx).Granted() }

// Busy is WaitBusy on w.
func (w *Wait) Busy(ahead int) {
	if w == nil || w.busy {
		return
	}
	w.busy = true
	w.span.SetAttributes(AttrPosition.Int(ahead))
}

// Granted is WaitGranted on w.
func (w *Wait) Granted() {
	if w != nil {
		w.handedOff = true
	}
}

// Fail ends the wait for err: not acquired, or failed.
func (w *Wait) Fail(err error) {
	if w == nil || w.ended {
		return
	}
	if errors.Is(err, lock.ErrNotAcquired) {
		w.End(WaitNotAcquired)
		return
	}
	w.span.RecordError(err)
	w.span.SetStatus(codes.Error, err.Error())
	w.End(WaitFailed)
}

// End ends the wait with outcome; only the first call counts.
func (w *Wait) End(outcome string) {
	if w == nil || w.ended {
		return
	}
	w.ended = true
	w.held = outcome == WaitAcquired
	w.span.SetAttributes(AttrOutcome.String(outcome), AttrHandedOff.Bool(w.handedOff))
	w.span.End()
}

// Hold is the span of one hold of a lock.
type Hold struct {
	span trace.Span
	mu   sync.Mutex
	done bool // ended, or the loss event added
	stop func() bool
}

// StartHold ends the wait in ctx (acquired) and starts the span of holding
// resource's lock with fence; the work under the lock runs in the returned
// context.
func (t *Tracer) StartHold(ctx context.Context, resource string, fence int64) (context.Context, *Hold) {
	if t == nil {
		return ctx, nil
	}
	t.waitOf(ctx).End(WaitAcquired)
	ctx, s := t.t.Start(ctx, SpanLockHold, trace.WithAttributes(AttrResource.String(resource), AttrFence.Int64(fence)))
	return ctx, &Hold{span: s}
}

// Permit records which permit of a resource with a limit the hold is
// (lockstep.permit); a lock's hold has none.
func (h *Hold) Permit(k int) {
	if h != nil {
		h.span.SetAttributes(AttrPermit.Int(k))
	}
}

// Watch adds the loss event at the moment hctx, the holder's context, ends
// with a lost lock as its cause.
func (h *Hold) Watch(hctx context.Context) {
	if h == nil {
		return
	}
	h.stop = context.AfterFunc(hctx, func() {
		if lost, ok := errors.AsType[*lock.LostError](context.Cause(hctx)); ok {
			h.mu.Lock()
			defer h.mu.Unlock()
			if !h.done {
				h.done = true
				h.span.AddEvent(EventLockLost, trace.WithAttributes(AttrReason.String(string(lost.Reason))))
			}
		}
	})
}

// End ends the hold: lost (with its reason, and the event if Watch did not
// see it), handed on to the next waiter, or released.
func (h *Hold) End(lost *lock.LostError, handedOn bool) {
	if h == nil {
		return
	}
	if h.stop != nil {
		h.stop()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case lost != nil:
		if !h.done {
			h.span.AddEvent(EventLockLost, trace.WithAttributes(AttrReason.String(string(lost.Reason))))
		}
		h.span.SetAttributes(AttrOutcome.String(HoldLost), AttrReason.String(string(lost.Reason)))
	case handedOn:
		h.span.SetAttributes(AttrOutcome.String(HoldHandedOff))
	default:
		h.span.SetAttributes(AttrOutcome.String(HoldReleased))
	}
	h.done = true
	h.span.End()
}

// SpanContext is the hold's span context (a hand-off links to it).
func (h *Hold) SpanContext() trace.SpanContext {
	if h == nil {
		return trace.SpanContext{}
	}
	return h.span.SpanContext()
}
