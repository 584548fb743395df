package jobs

import (
	"context"
	"errors"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// Tracing of the job server: each run of a task is a lockstep.job span, a
// child of the trace context in the task's headers; its lock's wait and hold
// are lockstep.lock.wait and lockstep.lock.hold (internal/tracing). The call
// sites in server.go and chain.go are one line each, marked "tracing".

// JobOutcome values besides the lockstep_jobs_processed_total results.
const outcomeRequeued = "requeued" // the lock was busy: the task waits among the resource's waiters

// handler is what asynq runs: ProcessTask, inside the task's job span when
// tracing is on or the task carries a trace context.
func (s *Server) handler() asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if s.trace == nil && len(t.Headers()) == 0 {
			return s.ProcessTask(ctx, t)
		}
		j := jobOf(ctx, t.Type())
		ctx, span := s.trace.StartJob(ctx, tracing.JobRun{ID: j.ID, Type: j.Type, Queue: j.Queue, Attempt: j.Attempt, Headers: t.Headers()})
		err := s.ProcessTask(ctx, t)
		span.End(jobOutcome(span, err), failed(err))
		return err
	})
}

// jobOutcome is the job span's lockstep.outcome for a run that returned err.
func jobOutcome(span *tracing.Job, err error) string {
	var lost *lostError
	switch {
	case err == nil && span.Waited():
		return ResultSkipped // or a replay: the task ran before, under a hand-off
	case err == nil:
		return ResultSuccess
	case !isFailure(err):
		return outcomeRequeued
	case errors.As(err, &lost):
		return ResultLockLost
	}
	return ResultFailure
}

// failed is err when it is a failure, for the span's status.
func failed(err error) error {
	if err != nil && isFailure(err) {
		return err
	}
	return nil
}
