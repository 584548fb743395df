package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// processRun runs a tick's task of a schedule with an overlap policy (the
// scheduler set overlap.HeaderSchedule) as the schedule's run: under its run
// lock, held through the watchdog, so that a dead worker's run ends within
// the lock's TTL and cancel_previous cancels the handler's context as a lost
// lock does (internal/overlap). The task's own lock, if it declares one, is
// taken inside, as for any task.
func (s *Server) processRun(ctx context.Context, t *asynq.Task, schedule string) error {
	job := jobOf(ctx, t.Type())
	l := s.runLocker()
	k := overlap.KeysFor(l.Prefix(), schedule)
	ctx = lock.WithJob(ctx, job.ID, job.Type)
	ctx = context.WithValue(ctx, inRunKey{}, true)
	run, err := overlap.Begin(ctx, s.client, l, k, job.ID, s.cfg.LockTTL)
	if s.recovery != nil && s.recovery.dequeues {
		// Until now (waiting for the run lock) a dead worker's run was
		// brought back by a recoverer: it had not begun. From here it is
		// not (holdsFor): it ends with its run lock, and the next tick runs.
		s.dropBare(ctx, job)
	}
	switch {
	case errors.Is(err, overlap.ErrEnded):
		s.metrics.JobsProcessed.WithLabelValues(job.Type, ResultSkipped).Inc()
		s.log.Info("schedule run ended by a later tick; task not run", "type", job.Type, "id", job.ID, "schedule", schedule)
		return nil
	case err != nil:
		if ctx.Err() != nil {
			return err
		}
		return soon(stepRunLock, job, fmt.Errorf("run lock of schedule %s: %w", schedule, err))
	}
	// A later tick that cancels the run (cancel_previous) deletes the run
	// lock: the watchdog cancels the handler's context as for any lost lock,
	// with a cause that names that tick (overlap.CancelledError).
	explain := func(lost *lock.LostError) error { return run.Cancelled(lost, explainTimeout) }
	hctx, hold := s.watchdog.Hold(ctx, run.Lease, watchdog.LogWith("task_id", job.ID, "type", job.Type, "schedule", schedule),
		watchdog.Explain(explain))
	s.track(hold)
	defer s.untrack(hold)
	s.log.Debug("schedule run started", "schedule", schedule, "id", job.ID, "fence", run.Lease.Fence())

	err = s.process(hctx, t)

	// asynq runs the task again after an error, unless it is final.
	again := err != nil && !errors.Is(err, SkipRetry) && (job.Attempt <= job.MaxRetry || !isFailure(err))
	live, ferr := run.Finish(context.WithoutCancel(ctx), again)
	switch {
	case ferr != nil:
		s.log.Warn("recording the end of a schedule run failed; the next tick finds it ended once its lock expires",
			"schedule", schedule, "id", job.ID, "err", ferr)
	case !live:
		attrs := []any{"schedule", schedule, "id", job.ID, "fence", run.Lease.Fence()}
		if c := (*overlap.CancelledError)(nil); errors.As(context.Cause(hctx), &c) {
			attrs = append(attrs, "by", c.By)
		}
		s.log.Info("schedule run ended by a later tick while it ran (cancel_previous, or its run lock was lost)", attrs...)
	}
	lost, relErr := hold.Finish(ctx)
	if relErr != nil {
		s.log.Warn("release of a schedule's run lock failed; it expires within its TTL", "schedule", schedule, "err", relErr)
	}
	s.log.Debug("schedule run finished", "schedule", schedule, "id", job.ID, "err", err, "lost", lost != nil)
	return err
}

// explainTimeout bounds the read that names the tick which cancelled a
// run; past it the cause is the run lock's plain loss. It runs where the
// watchdog handles losses, so it is kept short for the other holds.
const explainTimeout = 50 * time.Millisecond

type inRunKey struct{}

// runSpec is the spec a task runs with: a schedule's run whose handler's
// lock is busy waits for it here, under the run lock, however long, instead
// of being requeued, so that no hand-off runs it elsewhere without the run
// lock (there cancel_previous could not cancel it). A run holds only its own
// schedule's run lock while it waits, so the waits form no cycle.
func runSpec(ctx context.Context, spec *Spec) *Spec {
	if ctx.Value(inRunKey{}) == nil || spec.Resource == nil || spec.Contention == Skip {
		return spec
	}
	sp := *spec
	sp.Contention, sp.ContentionWait = Wait, 0 // 0: until the task's context ends
	return &sp
}

// runLocker is the Locker of schedules' run locks: the queue's Redis, where
// the scheduler reads them, also when handlers lock on another back end.
func (s *Server) runLocker() *lock.Locker {
	if s.locker.Backend() == "single" {
		return s.locker
	}
	s.runOnce.Do(func() {
		s.runLock = lock.New(s.client, lock.WithPrefix(s.locker.Prefix()))
	})
	return s.runLock
}
