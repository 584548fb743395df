package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Contention, in three moves (see the package documentation):
//
//  1. Locker.Take: a task takes its lock, or joins the resource's one waiter
//     queue (the queue WithLock and Acquire callers wait in) in arrival
//     order, and goes back to asynq's retry set (no failure).
//  2. Locker.HandOn: the holder's release hands the lock to the longest
//     waiter in the same step: a parked task is run by the releasing worker
//     itself (chain.go), without a second acquire or any poll; a goroutine
//     waiter is woken holding it.
//  3. A hand-off that cannot happen (the holder crashed) costs at most the
//     lock's TTL: every waiter's backoff ends after the lock's remaining
//     TTL, so the first in line is back when a dead holder's lock expires.
//     A grant to a parked task by any other release (WithLock's) is heard
//     here (watchGrants), and the task is brought back at once.

// waitersTTL is how long an idle resource's waiter queue outlives its last
// task's join.
func (s *Server) waitersTTL() time.Duration { return max(3*s.cfg.Backoff.Max, time.Minute) }

// markerTTL is how long a done marker lives unless it is dropped or
// refreshed: while asynq still holds its task, a redelivery can come as late
// as asynq's own recovery of a dead worker's task (asynqstore.Redelivery), or
// after a dead chain's claim (chainLease) passes. A task that completes drops
// its marker (the chain's claim, or the beat after its delivery returned),
// so a task enqueued again with the same id afterwards runs normally.
func (s *Server) markerTTL() time.Duration { return s.chainLease() + asynqstore.Redelivery }

// take asks for job's lock in one call (Locker.Take): acquired, granted by a
// hand-off, already done, or busy (then, with join, the task is among the
// waiters); with rate, its rate limit is decided in the same call (over it,
// the task is to be delayed to its turn).
func (s *Server) take(ctx context.Context, job Job, ttl time.Duration, join bool, rate *lock.TaskRate) (lock.Taken, error) {
	r, err := s.locker.Take(ctx, job.Resource, job.Queue, job.ID, ttl, s.waitersTTL(), join, s.holdsFor(ctx), max(job.limit, 1), rate)
	if err != nil {
		return r, err
	}
	if r.Head != "" {
		// Granted to the longest waiter, which no one handed on to.
		if q, id, ok := lock.ParseTaskWaiter(r.Head); ok {
			s.log.Info("lock free with waiters left by a holder that did not hand on; granted to the first", "resource", job.Resource, "id", id)
			s.wake(ctx, job.Resource, q, id)
		}
	}
	return r, nil
}

// wake brings a parked task that was granted its lock back now: from the
// retry set to the head of its queue.
func (s *Server) wake(ctx context.Context, resource, queue, id string) asynqstore.Woken {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	w, err := s.store.Wake(ctx, queue, id)
	if err != nil {
		s.log.Warn("waking the first waiter failed; it comes back with its backoff", "resource", resource, "id", id, "err", err)
	}
	return w
}

// watchGrants brings back every parked task that a release outside a chain
// (a WithLock caller's, a take that found a dead holder's lock expired)
// granted its lock to, and passes on a grant whose task asynq no longer has.
func (s *Server) watchGrants(ctx context.Context) error {
	return s.locker.Grants(ctx, func(n lock.GrantNotice) {
		go func() {
			if s.wake(ctx, n.Resource, n.Queue, n.ID) != asynqstore.WokenGone {
				return
			}
			s.log.Info("lock granted to a task that is gone; handed on", "resource", n.Resource, "id", n.ID)
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = s.locker.Pass(pctx, n, s.cfg.LockTTL)
		}()
	})
}

// requeue returns the error that has asynq park a task whose lock was busy
// (Take has put it among the waiters) until a hand-off claims it.
//
// The backoff is only the fallback for a hand-off that cannot happen (a
// holder that crashed hands on to no one): the first in line comes back a
// jittered moment after the lock's remaining TTL, when a dead holder's lock
// has expired, and takes it; the others come back at least a second later
// (asynq keeps retry times in whole seconds), by which time the first has
// handed on to them in order. A task that comes back while the holder lives
// only waits again, in its place.
//
// The take that parked the task recorded its bare record (recovery.go):
// should this worker die before asynq has the task back, a recoverer brings
// it back. It goes a whole beat after the task left.
//
// With a rate decided with its lock (job.turn), the waiters ahead start at
// least one emission interval apart, and the fallback allows for it: a
// task far back in a rate-limited queue is not brought back to wait again.
func (s *Server) requeue(job Job, r lock.Taken) error {
	s.recovery.left("", job.Queue, job.ID)
	d := max(r.PTTL, 0) + s.cfg.Backoff.Nth(1)
	if r.Ahead > 0 {
		d += time.Second + s.cfg.Backoff.Nth(1+r.Ahead) + time.Duration(r.Ahead)*job.turn
	}
	s.log.Debug("lock busy; task waits for a hand-off", "type", job.Type, "id", job.ID, "resource", job.Resource,
		"joined", r.Joined, "ahead", r.Ahead, "delay", d)
	if s.hooks.wait != nil && !r.Joined.IsZero() {
		s.hooks.wait(job, float64(r.Joined.UnixMicro())/1000)
	}
	return &ContendedError{Resource: job.Resource, Ahead: r.Ahead, Delay: d}
}

// replay turns a done marker's outcome into the task's result, without
// running it again: a delivery of a task that a hand-off chain ran but that
// asynq had not completed yet (the chain's worker crashed or stopped).
func (s *Server) replay(job Job, outcome string) error {
	s.log.Info("task already ran under a hand-off; not run again", "type", job.Type, "id", job.ID,
		"resource", job.Resource, "outcome", outcome)
	switch {
	case outcome == outcomeOK:
		return nil
	case len(outcome) > len(outcomeSkip) && outcome[:len(outcomeSkip)] == outcomeSkip:
		return fmt.Errorf("jobs: %s: %s: %w", job.Type, outcome[len(outcomeSkip):], SkipRetry)
	case len(outcome) > len(outcomeFail) && outcome[:len(outcomeFail)] == outcomeFail:
		return fmt.Errorf("jobs: %s: %s", job.Type, outcome[len(outcomeFail):])
	}
	return fmt.Errorf("jobs: %s: %s", job.Type, outcome)
}

// Outcomes in done markers.
const (
	outcomeOK   = "ok"
	outcomeFail = "fail:"
	outcomeSkip = "skip:"
)

func (s *Server) lockAcquire(result string) { s.metrics.LockAcquire.WithLabelValues(result).Inc() }

// waitInWorker waits in the worker, up to maxWait (0: until ctx ends), for
// job's lock: as a waiter of the one queue (Locker.Acquire), woken by the
// release that hands it the lock. It returns nil, nil when the wait ended
// without the lock; the caller then parks the task, at the end of the queue.
//
// While it waits, the task is recorded for a recoverer by its bare record
// (recovery.go); once it holds the lock, by its hold record, as a taken
// lock is.
func (s *Server) waitInWorker(ctx context.Context, job Job, ttl, maxWait time.Duration) (*lock.Lease, error) {
	if s.holdBare(ctx, job) {
		defer s.recovery.left("", job.Queue, job.ID)
	}
	lease, err := s.locker.Acquire(ctx, job.Resource, ttl, lock.MaxWait(maxWait), lock.Permits(max(job.limit, 1)))
	switch {
	case err == nil:
		s.swapBare(ctx, job, job.Resource)
		return lease, nil
	case ctx.Err() != nil || errors.Is(err, lock.ErrNotAcquired):
		return nil, nil
	}
	return nil, soon(stepLock, job, err)
}
