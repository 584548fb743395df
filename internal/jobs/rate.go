package jobs

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Rate limits (G11), decided before the handler runs. A task that also
// takes a lock has its rate decided with its lock, in one admission
// (taskRate, Locker.Take with a TaskRate: docs/design.md §3a), when the lock
// back end is the queue's Redis and the keys allow it, and it parks among
// its lock's waiters (Requeue): its rate is asked only when the lock would
// be given to it, so a wait for the lock spends no turn. Over the rate, it
// is delayed to its turn as below, its lock granted to it until then. A
// task handed the lock by a hand-off (chain.go) asks its rate as it starts,
// in its grant's take-over (Locker.TakeOver). Every other task asks its
// rate first, then takes its lock:
//
//  1. Locker.Reserve on the queue's Redis (GCRA on the server's clock): 0
//     runs the task now, its admission counted.
//  2. Over the rate, the task takes its turn (counted at once) and goes back
//     to asynq's retry set with a *RateLimitedError: no failure, so its
//     retry count stays and no attempt is used, delayed by the wait to its
//     turn (rounded up to asynq's whole second, asynqstore.RetryDelay). A
//     timer of this server brings it back at the turn itself
//     (asynqstore.Wake); the rounded retry time is the fallback when this
//     server stops first.
//  3. Back on its turn (up to turnLate after it), it is admitted without
//     asking again: dequeued twice, once to be given its turn and once to
//     run. Later than that its turn is gone (counted, not used) and it asks
//     afresh. The admissions, at their turns, keep N·w/Per + Burst over any
//     window; a start follows its admission by the wake and the poll.
//
// A task that cannot go back to asynq waits its turn in the worker instead:
// one with no retries left (asynq archives such a task on any error) and a
// schedule's run (it holds the schedule's run lock).

// admit applies spec's rate limit to job: nil runs it now (job.Admitted
// says when it was admitted; zero for a task admitted before it joined its
// lock's waiters); otherwise the task's result (a *RateLimitedError delays
// it, an invalid payload is archived, a Redis error is retried soon).
func (s *Server) admit(ctx context.Context, spec *Spec, job *Job, payload any) error {
	key, r := spec.Rate(payload)
	if key == "" {
		return s.invalid(*job, errors.New("the rate limit's key is empty"))
	}
	if err := r.Check(); err != nil {
		return s.invalid(*job, err)
	}
	if spec.Resource != nil && s.handsOff {
		// A task that joined its lock's waiters was admitted before it did.
		if resource := spec.Resource(payload); resource != "" {
			waiting, err := s.locker.Waiting(ctx, resource, job.Queue, job.ID, max(spec.Limit, 1))
			if err != nil {
				return soon(stepRate, *job, err)
			}
			if waiting {
				return nil
			}
		}
	}
	rates := s.runLocker() // the queue's Redis, whatever the lock back end
	// A task that can go back to asynq takes its turn when over the rate
	// (Reserve): it is admitted when it comes back on it, so it is dequeued
	// at most twice. One that cannot waits in the worker, asking again.
	delays := job.Attempt <= job.MaxRetry && ctx.Value(inRunKey{}) == nil
	for {
		var wait time.Duration
		var at time.Time
		var err error
		if delays {
			wait, at, err = rates.Reserve(ctx, key, r, job.Queue+":"+job.ID, s.turnLate())
		} else {
			wait, at, err = rates.AllowAt(ctx, key, r)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return soon(stepRate, *job, err)
		case wait == 0:
			s.admitted(ctx, job, key, at)
			return nil
		}
		if delays {
			return s.rateDelayed(*job, key, wait)
		}
		s.rateLimited(job.Type, wait)
		s.log.Debug("over its rate limit; task waits in the worker", "type", job.Type, "id", job.ID, "rate_key", key, "delay", wait)
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// taskRate returns job's rate limit for its lock's take to decide with the
// lock (one admission), or nil when the rate is asked first (admit): a
// handler without a lock, a lock back end other than the queue's Redis, a
// task that does not park among its lock's waiters (Wait, Skip, no retries
// left, a schedule's run), a rate key in another Cluster slot than the
// resource, or an invalid limit or name (admit or process archives it).
// A handed-on task's rate is asked by the same question, decided with its
// grant's take-over (Locker.TakeOver, runChained), so a task's rate is
// counted by one path only.
func (s *Server) taskRate(spec *Spec, job Job, payload any, inRun bool) *lock.TaskRate {
	if spec.Rate == nil || spec.Resource == nil || !s.handsOff || spec.Contention != Requeue ||
		job.Attempt > job.MaxRetry || inRun {
		return nil
	}
	resource := spec.Resource(payload)
	key, r := spec.Rate(payload)
	if resource == "" || key == "" || r.Check() != nil || !s.locker.OneAdmission(key, resource) {
		return nil
	}
	return &lock.TaskRate{Key: key, Rate: r, Late: s.turnLate()}
}

// admitted records job's admission by its rate, at at on the limit's schedule.
func (s *Server) admitted(ctx context.Context, job *Job, key string, at time.Time) {
	job.Admitted = at
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.Debug("rate limit admitted", "type", job.Type, "id", job.ID, "rate_key", key, "admitted_us", at.UnixMicro())
	}
}

func (s *Server) rateLimited(typ string, wait time.Duration) {
	s.metrics.RateLimited.WithLabelValues(typ).Inc()
	s.metrics.RateDelay.Observe(wait.Seconds())
}

// rateDelayed returns the result that delays job, over its rate, to its
// turn (taken, wait from now), and brings it back on it.
func (s *Server) rateDelayed(job Job, key string, wait time.Duration) error {
	s.rateLimited(job.Type, wait)
	s.log.Debug("over its rate limit; task delayed", "type", job.Type, "id", job.ID, "rate_key", key, "delay", wait)
	s.wakeAfter(job.Queue, job.ID, wait)
	return &RateLimitedError{Key: key, Delay: wait}
}

// turnLate is how long after its turn a task that took one (Reserve) is
// still admitted on it: it comes back by this worker's wake, then waits for
// a worker's next poll; later than that (its worker stopped, and asynq's
// whole-second retry time brought it back) it asks afresh.
func (s *Server) turnLate() time.Duration { return s.cfg.PollInterval + 250*time.Millisecond }

// wakeAfter brings task id of queue back from the retry set after d, the
// moment its rate admits it, rather than at asynq's next whole second. A
// task still active then (on its way to the retry set) is woken again for up
// to a second (wakeOnceParked); moved or gone, asynq's retry time is the
// fallback.
func (s *Server) wakeAfter(queue, id string, d time.Duration) {
	ctx := s.bgCtx
	if ctx == nil || ctx.Err() != nil || !s.recovers {
		return // not started, stopping, or an asynq whose layout asynqstore does not know
	}
	s.bg.Go(func() {
		if !backoff.Sleep(ctx, d) {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		w, err := s.store.Wake(wctx, queue, id)
		cancel()
		if err == nil && w == asynqstore.WokenActive {
			s.wakeOnceParked(ctx, queue, id, time.Second)
		}
	})
}
