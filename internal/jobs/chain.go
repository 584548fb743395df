package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// The hand-off chain. A worker that releases a lock someone waits for grants
// it to the longest waiting task (handoff.lua) and runs that task itself, in
// the same worker slot, then the next, until no one waits:
//
//	run T1 (delivered by asynq) ──► handoff: lock → T2, T1 marked done
//	     claim T2 (retry set, score = lease) ──► run T2 ──► handoff: lock → T3, T2 marked done
//	     complete T2 + claim T3 (one call) ──► run T3 ──► handoff: released, no one waits
//	     complete T3; drop T2's and T3's markers; return T1's result to asynq
//
// The lock never becomes free between two holders, so no task barges in and
// the next holder needs no acquire; no worker's poll is waited for. A claimed
// task stays in asynq's retry set with its score pushed ahead (its lease,
// renewed while it runs), so a chain that dies leaves it to asynq's own
// forwarder, which offers it again when the lease passes.
//
// Done markers keep a hand-off from running a task twice: the handoff that
// ends a task's run marks it done (with its outcome) in the same step. A
// delivery of a marked task (the chain's worker crashed or stopped first, or
// asynq completes the task itself: a retention, a failure) returns the
// outcome instead of running it (take.lua). A chained task's marker is
// dropped once claim.lua has completed the task in asynq, when no delivery
// of it is left; every other "ok" marker stays until markerTTL, because the
// delivery that read it can be lost too (its worker killed before asynq's
// completion), and the next one must read it again.

// grant is a lock handed on to a waiting task.
type grant struct {
	resource  string
	member    string // the waiter, JSON ["queue","id"]
	queue, id string
	token     string
	fence     int64
	ttl       time.Duration
	sent      time.Time
	inWorker  bool              // the waiter waits in its worker (the Wait policy), not in the retry set
	from      trace.SpanContext // tracing: the hold that handed the lock on
}

// handoff is what the release at the end of one run does, and what it found.
type handoff struct {
	mark    byte   // 'g': mark the finished task only when handing on (asynq completes it); 'a': always (a chained task)
	drop    string // done marker to drop in the same call (its task is complete), "" none
	outcome string // the finished run's outcome, set by run before the release; "" none (interrupted)

	next    *grant // the lock was handed on to this waiter
	marked  bool   // the finished task was marked done
	dropped bool   // drop was dropped
}

// release returns the release function for Finish: it releases lease and,
// when a task waits, hands the lock on to the longest waiting one.
func (s *Server) release(lease *lock.Lease, job Job, h *handoff) func(context.Context) error {
	return func(ctx context.Context) error {
		if lease.Err() != nil {
			// Lost (or concluded lost locally): the lock package's release,
			// which leaves another holder's lock alone.
			return lease.Release(ctx)
		}
		status, g, err := s.handOn(ctx, job.Resource, lease.Token(), lease.TTL(), job.Queue, job.ID, h)
		switch {
		case err != nil:
			return fmt.Errorf("lock: release %q: %w", job.Resource, err)
		case status == 0:
			return lease.MarkLost(lock.ReasonExpired)
		case status < 0:
			return lease.MarkLost(lock.ReasonStolen)
		}
		lease.MarkReleased()
		h.next = g
		return nil
	}
}

// handOn runs handoff.lua for the holder of token on resource; queue and id
// name the task that just ran ("" when none did: a pass).
func (s *Server) handOn(ctx context.Context, resource, token string, ttl time.Duration, queue, id string, h *handoff) (int64, *grant, error) {
	k := s.keys(resource)
	marker := k.lock + ":done:"
	if id != "" {
		marker = s.doneKey(resource, queue, id)
	}
	drop, dropFlag := k.lock+":done:", ""
	if h.drop != "" {
		drop, dropFlag = h.drop, "1"
	}
	outcome := h.outcome
	if id == "" {
		outcome = ""
	}
	sent := time.Now()
	next := lock.NewToken(ctx, sent) // this process holds next; the task it goes to is the script's choice
	v, err := run(ctx, s.client, scriptHandoff, []string{k.lock, k.fence, k.waiters, marker, drop},
		token, next, ttl.Milliseconds(), s.locker.FenceTTL().Milliseconds(),
		outcome, string(rune(cmp.Or(h.mark, 'g'))), markerTTL.Milliseconds(), dropFlag)
	if err != nil {
		return 0, nil, err
	}
	vals, _ := v.([]any)
	if len(vals) == 0 {
		return 0, nil, fmt.Errorf("unexpected reply %v", v)
	}
	status, _ := vals[0].(int64)
	if status <= 0 {
		return status, nil, nil
	}
	h.dropped = h.drop != ""
	h.marked = outcome != "" && (status == 2 || h.mark == 'a')
	if status == 1 {
		return 1, nil, nil
	}
	if len(vals) < 3 {
		return 0, nil, fmt.Errorf("unexpected reply %v", v)
	}
	m, _ := vals[1].(string)
	fence, _ := vals[2].(int64)
	g := &grant{resource: resource, member: m, token: next, fence: fence, ttl: ttl, sent: sent}
	var ok bool
	if g.queue, g.id, ok = parseMember(m); !ok {
		s.log.Warn("waiter not understood; lock handed past it", "resource", resource, "waiter", m)
	}
	return 2, g, nil
}

// outcomeOf is the done marker's value for a run that returned err.
func outcomeOf(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return outcomeOK // done, whatever else happened (G8)
	case ctx.Err() != nil:
		return "" // interrupted (shutdown, deadline): run again
	case errors.Is(err, SkipRetry):
		return outcomeSkip + err.Error()
	}
	return outcomeFail + err.Error()
}

// finished is a chained task that ran and that asynq still lists.
type finished struct {
	queue, id, unique string
	marker            string // its done marker, "" when none was set
}

// chaining reports whether this slot may run another handed-on task: not
// when the server stops or the delivered task's context is near its end.
func (s *Server) chaining(ctx context.Context) bool {
	if s.life.Phase() != lifecycle.Running || ctx.Err() != nil {
		return false
	}
	d, ok := ctx.Deadline()
	return !ok || time.Until(d) > time.Minute
}

// chain runs the tasks the lock is handed on to, starting with g, in this
// slot. The done marker of the task asynq delivered is left to expire: asynq
// completes that task only after the chain returns, and a worker killed in
// between leaves it to be delivered again, which must read the marker.
func (s *Server) chain(ctx context.Context, g *grant) {
	var done *finished
	drop := ""
	for g != nil {
		if g.id == "" {
			g = s.pass(ctx, g, &drop)
			continue
		}
		if !s.chaining(ctx) {
			s.deliver(ctx, g, false)
			break
		}
		msg, inWorker, err := s.claim(ctx, done, g, &drop)
		done = nil
		switch {
		case err != nil:
			s.log.Warn("claiming the next waiter failed; its lock expires within its TTL", "resource", g.resource, "id", g.id, "err", err)
			g = nil
			continue
		case inWorker:
			s.deliver(ctx, g, true)
			g = nil
			continue
		case msg == nil:
			g = s.pass(ctx, g, &drop)
			continue
		}
		g, done = s.runChained(ctx, g, msg, &drop)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if done != nil {
		if _, _, err := s.claim(wctx, done, nil, &drop); err != nil {
			s.log.Warn("completing a handed-on task failed; its done marker keeps it from running again", "id", done.id, "err", err)
		}
	}
	if drop != "" {
		// Its task is complete in asynq (claim.lua deleted it): no delivery
		// of it is left to read the marker.
		_ = s.client.Del(wctx, drop).Err()
	}
}

// claim completes done (if set) and claims g's task in asynq, waiting a
// moment for a task still on its way to the retry set. It returns the
// task's message; or inWorker when the task waits in its worker (Wait);
// or neither when g's task is not there to run (passed over).
func (s *Server) claim(ctx context.Context, done *finished, g *grant, drop *string) (msg []byte, inWorker bool, err error) {
	if done != nil && g != nil && done.queue != g.queue {
		if _, _, err := s.claim(ctx, done, nil, drop); err != nil {
			return nil, false, err
		}
		done = nil
	}
	queue := ""
	switch {
	case g != nil:
		queue = g.queue
	case done != nil:
		queue = done.queue
	default:
		return nil, false, nil
	}
	p := asynqQueuePrefix(queue)
	now := time.Now()
	keys := []string{p + "retry", p + "t:", p + "processed:" + now.UTC().Format("2006-01-02"), p + "processed", p + "unique:", p + "t:"}
	args := []any{"", now.Add(90 * 24 * time.Hour).Unix(), "", "", s.leaseUntil(now)}
	if done != nil {
		keys[1], args[0] = p+"t:"+done.id, done.id
		if done.unique != "" {
			keys[4], args[2] = done.unique, "1"
		}
	}
	if g != nil {
		keys[5], args[3] = p+"t:"+g.id, g.id
	}
	wait, begin := 200*time.Microsecond, time.Now()
	for {
		v, err := run(ctx, s.client, scriptClaim, keys, args...)
		if err != nil {
			return nil, false, err
		}
		vals, _ := v.([]any)
		if len(vals) < 2 {
			return nil, false, fmt.Errorf("unexpected reply %v", v)
		}
		if done != nil {
			if vals[0] == int64(1) && done.marker != "" {
				*drop = done.marker // complete now: its marker goes with the next handoff
			}
			keys[1], args[0], args[2] = p+"t:", "", ""
			done = nil
		}
		switch vals[1] {
		case int64(1):
			m, _ := vals[2].(string)
			return []byte(m), false, nil
		case int64(-2):
			return nil, true, nil
		case int64(-1):
			// Still active: most likely on its way to the retry set (its
			// worker is returning from take.lua). Bounded: a worker that
			// died there leaves it to asynq's lease recovery.
			if time.Since(begin) > claimPatience || ctx.Err() != nil {
				s.log.Info("next waiter still active elsewhere; passed over", "resource", g.resource, "id", g.id)
				return nil, false, nil
			}
			time.Sleep(wait)
			wait = min(2*wait, 10*time.Millisecond)
			continue
		}
		return nil, false, nil
	}
}

// claimPatience bounds how long a claim waits for a waiter that is still
// active: a worker returns a contended task to asynq within milliseconds.
const claimPatience = 100 * time.Millisecond

// chainLease is how far ahead a claimed task's retry score is set: beyond
// the lock's TTL, so that the task comes back only after a dead chain's
// lock has expired; it is renewed at a third of it while the task runs.
func (s *Server) chainLease() time.Duration { return s.cfg.LockTTL + max(s.cfg.LockTTL, 2*time.Second) }

func (s *Server) leaseUntil(now time.Time) int64 {
	return now.Add(s.chainLease()).Unix() + 1
}

// keepClaim renews a claimed task's lease until stop is called.
func (s *Server) keepClaim(queue, id string) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.chainLease() / 3)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := s.client.ZAddXX(ctx, asynqQueuePrefix(queue)+"retry", redis.Z{Score: float64(s.leaseUntil(now)), Member: id}).Err()
				cancel()
				if err != nil {
					s.log.Warn("renewing a handed-on task's lease failed", "id", id, "err", err)
				}
			}
		}
	})
	return func() { close(quit); wg.Wait() }
}

// pass hands g's lock on to the waiter after it: g's task is not there to
// run (gone, or still active elsewhere).
func (s *Server) pass(ctx context.Context, g *grant, drop *string) *grant {
	h := &handoff{drop: *drop}
	_, next, err := s.handOn(context.WithoutCancel(ctx), g.resource, g.token, g.ttl, "", "", h)
	if err != nil {
		s.log.Warn("handing the lock past a waiter failed; it expires within its TTL", "resource", g.resource, "err", err)
		return nil
	}
	if h.dropped {
		*drop = ""
	}
	return next
}

// deliver leaves g's task to asynq: it marks the lock granted to the task
// and moves the task to the head of its queue, so that whichever worker
// takes it takes the lock over (take.lua). For a chain that stops, a task
// this worker has no handler for, and a waiter that waits in its worker
// (inWorker: the grant's notice wakes it).
func (s *Server) deliver(ctx context.Context, g *grant, inWorker bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	k := s.keys(g.resource)
	if _, err := run(ctx, s.client, scriptGrant, []string{k.lock}, g.token, g.member, g.ttl.Milliseconds()); err != nil {
		s.log.Warn("granting the lock to the next waiter failed; it expires within its TTL", "resource", g.resource, "err", err)
		return
	}
	if inWorker {
		s.client.Publish(ctx, k.lock+":granted", g.member)
		return
	}
	if _, err := run(ctx, s.client, scriptWake, asynqTaskKeys(g.queue, g.id), g.id, time.Now().UnixNano()); err != nil {
		s.log.Warn("waking the next waiter failed; it comes back with its backoff", "resource", g.resource, "id", g.id, "err", err)
	}
}

// runChained runs a claimed task under its granted lock. It returns the
// next grant, and the task when asynq still has to complete it.
func (s *Server) runChained(ctx context.Context, g *grant, msg []byte, drop *string) (*grant, *finished) {
	m, err := decodeTaskMsg(msg)
	var spec *Spec
	if err == nil {
		var ok bool
		if spec, ok = s.registry.Lookup(m.Type); !ok {
			err = fmt.Errorf("no handler for task type %q on this worker", m.Type)
		}
	}
	var payload any
	if err == nil {
		if payload, err = spec.Decode(m.Payload); err == nil && spec.Resource != nil && spec.Resource(payload) != g.resource {
			err = errors.New("its payload names another resource now")
		}
	}
	if err != nil {
		s.log.Info("handed-on task not run here; left to asynq", "resource", g.resource, "id", g.id, "err", err)
		s.deliver(ctx, g, false)
		return nil, nil
	}
	job := Job{ID: m.ID, Type: m.Type, Queue: m.Queue, Attempt: m.Retried + 1, MaxRetry: m.Retry, Resource: g.resource}
	ttl := min(cmp.Or(spec.TTL, s.cfg.LockTTL), g.ttl)
	lease, err := s.locker.Adopt(g.resource, g.token, g.fence, ttl, g.sent)
	if err != nil {
		s.deliver(ctx, g, false)
		return nil, nil
	}
	s.lockAcquire(metrics.AcquireAcquired)
	rctx, cancel := taskContext(ctx, m)
	rctx, span := s.trace.StartJob(rctx, tracing.JobRun{ID: job.ID, Type: job.Type, Queue: job.Queue, Attempt: job.Attempt,
		Headers: m.Headers, HandedOnBy: g.from}) // tracing
	rctx, wait := s.trace.StartWait(rctx, g.resource) // tracing
	wait.Granted()
	stop := s.keepClaim(m.Queue, m.ID)
	h := &handoff{mark: 'a', drop: *drop}
	err = s.run(rctx, spec, job, payload, lease, h)
	span.End(jobOutcome(span, err), failed(err)) // tracing
	stop()
	cancel()
	if h.dropped {
		*drop = ""
	}
	marker := ""
	if h.marked {
		marker = s.doneKey(g.resource, m.Queue, m.ID)
	}
	if err == nil && (m.Retention == 0 || marker == "") {
		return h.next, &finished{queue: m.Queue, id: m.ID, unique: m.UniqueKey, marker: marker}
	}
	// asynq does the rest: a failure's retry or archive (the marker
	// replays the outcome), a completion kept for its retention, or a run
	// that was interrupted (no marker: it runs again).
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	if _, werr := run(wctx, s.client, scriptWake, asynqTaskKeys(m.Queue, m.ID), m.ID, time.Now().UnixNano()); werr != nil {
		s.log.Warn("returning a handed-on task to asynq failed; it comes back when its lease passes", "id", m.ID, "err", werr)
	}
	wcancel()
	return h.next, nil
}

// taskContext bounds a chained run by its task's own timeout and deadline,
// as asynq would.
func taskContext(ctx context.Context, m taskMsg) (context.Context, context.CancelFunc) {
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
