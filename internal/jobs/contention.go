package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// Contention, in three moves (see the package documentation):
//
//  1. take.lua: a task takes its lock, or joins the resource's waiters in
//     arrival order and goes back to asynq's retry set (no failure).
//  2. handoff.lua: the holder's release grants the lock to the longest
//     waiting task in the same step, and the releasing worker runs that
//     task itself (chain.go), without a second acquire or any poll.
//  3. A hand-off that cannot happen (the holder crashed) costs at most the
//     lock's TTL: every waiter's backoff ends after the lock's remaining
//     TTL, so the first in line is back when a dead holder's lock expires.

// waiter names a task among a resource's waiters.
func waiter(job Job) string { return member(job.Queue, job.ID) }

func member(queue, id string) string {
	b, _ := json.Marshal([2]string{queue, id})
	return string(b)
}

// parseMember is waiter's inverse.
func parseMember(m string) (queue, id string, ok bool) {
	var w [2]string
	if json.Unmarshal([]byte(m), &w) != nil || w[1] == "" {
		return "", "", false
	}
	return w[0], w[1], true
}

// resourceKeys are the Redis keys of one resource that the job server uses:
// the lock's own (internal/lock builds them) and, under the same hash tag,
// the waiters.
type resourceKeys struct{ lock, fence, waiters string }

func (s *Server) keys(resource string) resourceKeys {
	k := s.locker.Key(resource)
	return resourceKeys{lock: k, fence: s.locker.FenceKey(resource), waiters: k + ":waiters"}
}

// doneKey marks a task that ran under a hand-off until asynq has completed it.
func (s *Server) doneKey(resource, queue, id string) string {
	return s.locker.Key(resource) + ":done:" + queue + ":" + id
}

// waitersTTL is how long an idle resource's waiters zset outlives its last
// contention.
func (s *Server) waitersTTL() time.Duration { return max(3*s.cfg.Backoff.Max, time.Minute) }

// markerTTL is how long a done marker lives unless a chain drops it (only
// once claim.lua has completed its task): an "ok" marker is never consumed
// by the delivery that replays it, so it must outlast every redelivery
// asynq can still make (a lease recovered after a worker died, a task kept
// for its retention); those come within minutes while any worker runs.
const markerTTL = 24 * time.Hour

// takeResult is take.lua's answer.
type takeResult struct {
	lease   *lock.Lease // acquired or granted
	granted bool
	outcome string        // the task already ran under a hand-off: its outcome
	done    bool          // outcome is set
	pttl    time.Duration // busy: the lock's remaining TTL
	ahead   int           // busy: waiters before this one
	since   float64       // busy: first contention, Unix ms, when it began now (else 0)
}

// take asks for job's lock in one call: acquired, granted by a hand-off,
// already done, or busy (then the task is among the waiters).
// Waiting modes of take.lua.
const (
	waitJoin = "q" // busy: join the waiters
	waitNot  = "n" // busy: do not wait
)

func (s *Server) take(ctx context.Context, job Job, ttl time.Duration, mode string) (takeResult, error) {
	k := s.keys(job.Resource)
	sent := time.Now()
	token := lock.NewToken(ctx, sent)
	v, err := run(ctx, s.client, scriptTake,
		[]string{k.lock, k.fence, k.waiters, s.doneKey(job.Resource, job.Queue, job.ID)},
		token, ttl.Milliseconds(), s.locker.FenceTTL().Milliseconds(), waiter(job), s.waitersTTL().Milliseconds(), mode)
	s.metrics.LockAcquireDuration.Observe(time.Since(sent).Seconds())
	if err != nil {
		s.lockAcquire(metrics.AcquireError)
		return takeResult{}, fmt.Errorf("lock: acquire %q: %w", job.Resource, err)
	}
	vals, _ := v.([]any)
	if len(vals) < 2 {
		s.lockAcquire(metrics.AcquireError)
		return takeResult{}, fmt.Errorf("lock: acquire %q: unexpected reply %v", job.Resource, v)
	}
	switch vals[0] {
	case int64(1), int64(2):
		tok, _ := vals[1].(string)
		var fence int64
		if len(vals) > 2 {
			fence, _ = vals[2].(int64)
		}
		lease, err := s.locker.Adopt(job.Resource, tok, fence, ttl, sent)
		if err != nil {
			return takeResult{}, err
		}
		s.lockAcquire(metrics.AcquireAcquired)
		return takeResult{lease: lease, granted: vals[0] == int64(2)}, nil
	case int64(3):
		out, _ := vals[1].(string)
		return takeResult{done: true, outcome: out}, nil
	case int64(0), int64(4):
		s.lockAcquire(metrics.AcquireBusy)
		r := takeResult{}
		if len(vals) == 5 {
			// Granted to the longest waiter, which no one handed on to.
			head, _ := vals[4].(string)
			s.wakeGranted(ctx, job.Resource, head)
		}
		if len(vals) >= 4 {
			p, _ := vals[1].(int64)
			a, _ := vals[3].(int64)
			r.pttl, r.ahead = time.Duration(p)*time.Millisecond, int(a)
			str, _ := vals[2].(string)
			r.since, _ = strconv.ParseFloat(str, 64)
		}
		return r, nil
	}
	s.lockAcquire(metrics.AcquireError)
	return takeResult{}, fmt.Errorf("lock: acquire %q: unexpected reply %v", job.Resource, v)
}

// wakeGranted brings the waiter head, which take.lua has just granted the
// free lock to, to take it: from the retry set to the head of its queue, or
// by the grant's notice when it waits in its worker.
func (s *Server) wakeGranted(ctx context.Context, resource, head string) {
	queue, id, ok := parseMember(head)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	s.log.Info("lock free with waiters left by a holder that did not hand on; granted to the first", "resource", resource, "id", id)
	s.client.Publish(ctx, s.keys(resource).lock+":granted", head)
	if _, err := run(ctx, s.client, scriptWake, asynqTaskKeys(queue, id), id, time.Now().UnixNano()); err != nil {
		s.log.Warn("waking the first waiter failed; it comes back with its backoff", "resource", resource, "id", id, "err", err)
	}
}

// requeue returns the error that has asynq park a task whose lock was busy
// (take.lua has put it among the waiters) until a hand-off claims it.
//
// The backoff is only the fallback for a hand-off that cannot happen (a
// holder that crashed hands on to no one): the first in line comes back a
// jittered moment after the lock's remaining TTL, when a dead holder's lock
// has expired, and takes it; the others come back at least a second later
// (asynq keeps retry times in whole seconds), by which time the first has
// handed on to them in order. A task that comes back while the holder lives
// only waits again, in its place.
func (s *Server) requeue(job Job, r takeResult) error {
	d := max(r.pttl, 0) + s.cfg.Backoff.Nth(1)
	if r.ahead > 0 {
		d += time.Second + s.cfg.Backoff.Nth(1+r.ahead)
	}
	s.log.Debug("lock busy; task waits for a hand-off", "type", job.Type, "id", job.ID, "resource", job.Resource,
		"since_ms", r.since, "ahead", r.ahead, "delay", d)
	if s.onWait != nil && r.since > 0 {
		s.onWait(job, r.since)
	}
	return &ContendedError{Resource: job.Resource, Ahead: r.ahead, Delay: d}
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

// waitsField, in a task's asynq hash, says that the task waits for its lock
// in its worker (claim.lua).
const waitsField = "lockstep_waits"

// Outcomes in done markers.
const (
	outcomeOK   = "ok"
	outcomeFail = "fail:"
	outcomeSkip = "skip:"
)

func (s *Server) lockAcquire(result string) { s.metrics.LockAcquire.WithLabelValues(result).Inc() }

// asynqTaskKeys are the keys of wake.lua: the task's hash, its queue's retry
// set and pending list, in asynq v0.26's layout (internal/base).
func asynqTaskKeys(queue, id string) []string {
	prefix := asynqQueuePrefix(queue)
	return []string{prefix + "t:" + id, prefix + "retry", prefix + "pending"}
}

func asynqQueuePrefix(queue string) string { return "asynq:{" + queue + "}:" }

// waitInWorker waits in the worker, up to maxWait (0: until ctx ends), for
// the lock to be handed to job: the release that grants it publishes the
// grant, and the backoff re-asks as the fallback for a notice that was
// missed. It returns nil, nil when the wait ended without the lock, leaving
// job among the waiters (parked in the retry set from then on).
func (s *Server) waitInWorker(ctx context.Context, job Job, ttl, maxWait time.Duration) (*lock.Lease, error) {
	k := s.keys(job.Resource)
	// Tell a hand-off that this waiter waits here (claim.lua): it is woken
	// by the grant's notice rather than claimed from the retry set.
	task := asynqQueuePrefix(job.Queue) + "t:" + job.ID
	s.client.HSet(ctx, task, waitsField, "1")
	defer s.client.HDel(context.WithoutCancel(ctx), task, waitsField)
	wctx := ctx
	if maxWait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, maxWait)
		defer cancel()
	}
	sub := s.client.Subscribe(wctx, k.lock+":granted")
	defer sub.Close()
	notices := sub.Channel(redis.WithChannelSize(16))
	me := waiter(job)
	var delay time.Duration
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		r, err := s.take(ctx, job, ttl, waitJoin)
		switch {
		case err != nil:
			return nil, &soonError{fmt.Errorf("jobs: %s: %w", job.Type, err)}
		case r.done:
			return nil, s.replay(job, r.outcome)
		case r.lease != nil:
			return r.lease, nil
		}
		delay = s.cfg.Backoff.Next(delay)
		timer.Reset(delay)
	wait:
		select {
		case <-wctx.Done():
			// Park from now on: a chain claims parked waiters; a grant that
			// came just now is taken over here.
			s.client.HDel(context.WithoutCancel(ctx), task, waitsField)
			if ctx.Err() == nil {
				if r, err := s.take(ctx, job, ttl, waitJoin); err == nil && r.lease != nil {
					return r.lease, nil
				}
			}
			return nil, nil
		case n, ok := <-notices:
			if ok && n.Payload != me {
				goto wait
			}
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
