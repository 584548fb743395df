package jobs

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// SkipRetry, returned by a handler (or wrapped), archives the task at once
// instead of retrying it.
var SkipRetry = asynq.SkipRetry

// ContendedError is returned to asynq when a task's lock was busy. asynq's
// IsFailure says it is no failure, so the task's retry count stays as it was,
// and RetryDelay takes the delay from it.
type ContendedError struct {
	Resource string
	Ahead    int           // tasks waiting for the lock before this one
	Delay    time.Duration // fallback backoff, should no hand-off claim the task first
}

// Error is short: asynq keeps it in the task's message (its last error) for
// as long as it keeps the task, a completed task's retention included.
func (e *ContendedError) Error() string {
	return fmt.Sprintf("lock %q busy, %d ahead", e.Resource, e.Ahead)
}

// RateLimitedError is returned to asynq when a task was over its rate limit:
// as for ContendedError, IsFailure says it is no failure (the retry count
// stays) and RetryDelay takes the delay from it, the wait the limit gave.
type RateLimitedError struct {
	Key   string
	Delay time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("rate limit %q: delayed %v", e.Key, e.Delay.Round(time.Millisecond))
}

// FairWaitError is returned to asynq when a task waits for its tenant's
// fair share: as for ContendedError, IsFailure says it is no failure (the
// retry count stays). Its turn brings it back (fair.go); Delay is the
// fallback, should no turn come.
type FairWaitError struct {
	Tenant string
	Delay  time.Duration
}

func (e *FairWaitError) Error() string {
	return fmt.Sprintf("tenant %q waits for its fair share", e.Tenant)
}

// lostError is the result of a failed run during which the lock was lost:
// it is retried soon. errors.Is(err, lock.ErrLockLost) holds. (A run that
// returned nil is done, lock or no lock: see Server.run.)
type lostError struct {
	lost    error // matches lock.ErrLockLost
	handler error // the handler's own error
}

func (e *lostError) Error() string {
	return fmt.Sprintf("%v (handler returned: %v)", e.lost, e.handler)
}

func (e *lostError) Unwrap() []error { return []error{e.lost, e.handler} }

// soonError marks a failure that is retried with the short contention backoff
// rather than asynq's minutes-long default: the lock was lost, or its back
// end (or the queue's Redis) failed in a step before the handler: step says
// which, for the worker's log (ProcessTask).
type soonError struct {
	step string
	err  error
}

// The steps before a handler whose failure retries its task soon.
const (
	stepLock    = "taking the task's lock"
	stepRunLock = "taking the schedule's run lock"
	stepRate    = "asking the task's rate limit"
	stepFair    = "asking the task's fair share"
)

// soon returns job's soonError for err in step.
func soon(step string, job Job, err error) *soonError {
	return &soonError{step: step, err: fmt.Errorf("jobs: %s: %w", job.Type, err)}
}

func (e *soonError) Error() string { return e.err.Error() }
func (e *soonError) Unwrap() error { return e.err }

// isFailure is asynq's Config.IsFailure: everything but contention, a
// rate limit's delay and a wait for a fair share is one.
func isFailure(err error) bool {
	var c *ContendedError
	var r *RateLimitedError
	var f *FairWaitError
	return !errors.As(err, &c) && !errors.As(err, &r) && !errors.As(err, &f)
}

// retryDelay is asynq's Config.RetryDelayFunc. n is the task's retry count
// before this retry.
func retryDelay(b backoff.Jitter) asynq.RetryDelayFunc {
	return func(n int, err error, t *asynq.Task) time.Duration {
		var c *ContendedError
		var r *RateLimitedError
		var soon *soonError
		var f *FairWaitError
		switch {
		case errors.As(err, &f):
			return asynqstore.RetryDelay(f.Delay, time.Now())
		case errors.As(err, &c):
			return asynqstore.RetryDelay(c.Delay, time.Now())
		case errors.As(err, &r):
			return asynqstore.RetryDelay(r.Delay, time.Now())
		case errors.As(err, &soon), errors.Is(err, lock.ErrLockLost), errors.Is(err, asynq.ErrLeaseExpired):
			// A crashed worker (lease expired) is a lost lock too: retry soon.
			return asynqstore.RetryDelay(b.Nth(n+1), time.Now())
		}
		return asynq.DefaultRetryDelayFunc(n, err, t)
	}
}
