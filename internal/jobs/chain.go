package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// The hand-off chain. A worker that releases a lock someone waits for grants
// it to the longest waiting task (handon.lua) and runs that task itself, in
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
// outcome instead of running it (take.lua). A chained task that succeeded is
// completed by the chain itself (claim.lua: deleted, or kept completed for
// its retention) and its marker dropped with it; the delivered task's marker
// is kept alive while the chain runs and dropped one beat after asynq got
// its result; any other marker lives markerTTL, as long as asynq can still
// deliver its task.

// handoff is what the release at the end of one run does, and what it found.
type handoff struct {
	chained bool   // the finished task was itself handed on (mark it done always: asynq completes it later)
	keep    string // the delivered task's done marker, kept alive while the chain runs
	// release, when set, releases instead of the hand-off (a lock taken
	// through the Locker), given the run's outcome.
	release func(ctx context.Context, outcome string) error
	drop    string // done marker to drop in the same call (its task is complete), "" none
	outcome string // the finished run's outcome, set by run before the release; "" none (interrupted)

	next    *lock.TaskGrant   // the lock was handed on to this waiting task
	from    trace.SpanContext // tracing: the hold that handed it on
	marker  string            // the finished task's done marker, when the release marked it done
	dropped bool              // drop was dropped
}

// release returns the release function for Finish: it releases lease and,
// when someone waits, hands the lock on to the longest waiter. A chained
// task leaves this process's hands with it (its record goes a beat later);
// the delivered task once asynq has its result (serve).
func (s *Server) release(lease *lock.Lease, job Job, h *handoff) func(context.Context) error {
	return func(ctx context.Context) error {
		if h.chained {
			s.recovery.left(job.Resource, job.Queue, job.ID)
		}
		r, err := s.locker.HandOn(ctx, lease, lock.HandOff{Chain: true, Queue: job.Queue, ID: job.ID,
			Outcome: h.outcome, MarkAlways: h.chained, MarkerTTL: s.markerTTL(), Drop: h.drop, Keep: h.keep,
			RecoveryTTL: s.recoveryTTL(), Holds: s.recovery.reg.Holds()})
		h.next, h.marker, h.dropped = r.Next, r.Marker, r.Dropped
		return err
	}
}

// outcomeOf is the done marker's value for a run that returned err.
func outcomeOf(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return outcomeOK // done, whatever else happened (G8)
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "" // interrupted (shutdown): run again
	// A task's own timeout or deadline is a failure, as asynq counts it.
	case errors.Is(err, SkipRetry):
		return outcomeSkip + err.Error()
	}
	return outcomeFail + err.Error()
}

// finished is a chained task that ran and that asynq still lists.
type finished struct {
	queue, id, unique string
	marker            string // its done marker, "" when none was set
	retention         time.Duration
	msg               []byte // its encoded message, for a completion kept for its retention
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

// followChain runs chain in this slot for the task asynq delivered, which
// has finished. While the worker runs, it returns when the chain ends, and
// the delivered task's result goes to asynq then. When the worker stops
// first, it returns at once: asynq completes the delivered task rather than
// push it back to its queue when its shutdown timeout passes (the done
// marker would keep it from running twice, but the next worker would
// dequeue it for nothing). The chain runs on, counted among the running
// handlers that Stop waits for; its task's context ends when asynq's share
// of the grace does, as a delivered task's would, so that an interrupted
// task goes back to its queue before Stop ends the holds left.
func (s *Server) followChain(ctx context.Context, g *lock.TaskGrant, from trace.SpanContext, keep string) {
	var left atomic.Bool
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cancelAt := cancel
	if d, ok := ctx.Deadline(); ok {
		cctx, cancelAt = context.WithDeadline(cctx, d) // the delivered task's deadline bounds its chain
	}
	unlink := context.AfterFunc(ctx, func() {
		if !left.Load() {
			cancel() // asynq ended the delivered task's run (its deadline, or the end of its grace)
		}
	})
	s.enter()
	done := make(chan struct{})
	go func() {
		defer s.leave()
		defer close(done)
		defer cancel()
		defer cancelAt()
		s.chain(cctx, g, from, keep)
	}()
	select {
	case <-done:
		unlink()
	case <-s.stopping:
		left.Store(true)
		s.mu.Lock()
		giveUp := s.giveUp
		s.mu.Unlock()
		time.AfterFunc(time.Until(giveUp), cancel) // a no-op once the chain has ended (it cancels on its way out)
		s.log.Info("worker stopping: the delivered task's result goes to asynq; its slot's handed-on task runs on within the grace",
			"resource", g.Resource, "next", g.ID)
	}
}

// chain runs the tasks the lock is handed on to, starting with g, in this
// slot. The done marker of the task asynq delivered is left to expire: asynq
// completes that task only after the chain returns, and a worker killed in
// between leaves it to be delivered again, which must read the marker.
func (s *Server) chain(ctx context.Context, g *lock.TaskGrant, from trace.SpanContext, keep string) {
	var done *finished
	drop := ""
	for g != nil {
		if g.ID == "" {
			g = s.pass(ctx, g, &drop)
			continue
		}
		if !s.chaining(ctx) {
			s.deliver(ctx, g)
			break
		}
		msg, active, err := s.claim(ctx, done, g, &drop)
		done = nil
		switch {
		case err != nil:
			s.log.Warn("claiming the next waiter failed; its lock expires within its TTL", "resource", g.Resource, "id", g.ID, "err", err)
			g = nil
			continue
		case active:
			// Still on its way back to the retry set (its worker is slow to
			// park it), or pending: granted, it keeps its turn (a parked one
			// is woken once parked).
			s.deliver(ctx, g)
			g = nil
			continue
		case msg == nil:
			g = s.pass(ctx, g, &drop)
			continue
		}
		next, nextFrom, fin, ran := s.runChained(ctx, g, from, keep, msg, &drop)
		if !ran {
			s.deliver(ctx, g)
		}
		g, from, done = next, nextFrom, fin
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if done != nil {
		if _, _, err := s.claim(wctx, done, nil, &drop); err != nil {
			s.log.Warn("completing a handed-on task failed; its done marker keeps it from running again", "id", done.id, "err", err)
		}
	}
	if drop != "" {
		// Its task is complete in asynq (the claim deleted it): no delivery
		// of it is left to read the marker.
		_ = s.recovery.reg.DropMarker(wctx, drop)
	}
}

// claim completes done (if set) and claims g's task in asynq, waiting a
// moment for a task still on its way to the retry set. It returns the
// task's message; or active, when g's task is still active after that
// moment or pending (on its way to a worker: either way it is granted the
// lock); or neither, when g's task is not there to run (passed over).
func (s *Server) claim(ctx context.Context, done *finished, g *lock.TaskGrant, drop *string) (msg []byte, active bool, err error) {
	if done != nil && g != nil && done.queue != g.Queue {
		if _, _, err := s.claim(ctx, done, nil, drop); err != nil {
			return nil, false, err
		}
		done = nil
	}
	var fin *asynqstore.Finished
	if done != nil {
		fin = &asynqstore.Finished{Queue: done.queue, ID: done.id, Unique: done.unique, Retention: done.retention, Msg: done.msg}
	}
	queue, id := "", ""
	if g != nil {
		queue, id = g.Queue, g.ID
	}
	var wait time.Duration
	begin := time.Now()
	for {
		completed, c, msg, err := s.store.Claim(ctx, fin, queue, id, s.leaseUntil(time.Now()))
		if err != nil {
			return nil, false, err
		}
		if fin != nil {
			if completed && done.marker != "" {
				*drop = done.marker // complete now: its marker goes with the next hand-off
			}
			fin = nil
		}
		switch c {
		case asynqstore.ClaimedOK:
			return msg, false, nil
		case asynqstore.ClaimedPending:
			// Its retry time came (asynq's forwarder moved it) or a
			// recoverer brought it back: a worker is about to take it.
			// Granted, it keeps its turn; passed over, it would join the
			// end of the queue.
			return nil, true, nil
		case asynqstore.ClaimedActive:
			// Still active: most likely on its way to the retry set (its
			// worker is returning from its take).
			if time.Since(begin) > claimPatience || ctx.Err() != nil {
				return nil, true, nil
			}
			wait = parking.Next(wait)
			backoff.Sleep(ctx, wait)
			continue
		}
		return nil, false, nil
	}
}

// claimPatience bounds how long a claim waits for a waiter that is still
// active: a worker returns a contended task to asynq within milliseconds.
const claimPatience = 100 * time.Millisecond

// parking paces the looks at a task on its way to the retry set.
var parking = backoff.Jitter{Min: 200 * time.Microsecond, Max: 10 * time.Millisecond}

// chainLease is how far ahead a claimed task's retry score is set: beyond
// the lock's TTL, so that the task comes back only after a dead chain's
// lock has expired; it is renewed at a third of it while the task runs.
func (s *Server) chainLease() time.Duration { return s.cfg.LockTTL + max(s.cfg.LockTTL, 2*time.Second) }

func (s *Server) leaseUntil(now time.Time) time.Time { return now.Add(s.chainLease()) }

// keepClaim renews a claimed task's lease, and the delivered task's done
// marker keep (if any), until stop is called.
func (s *Server) keepClaim(queue, id, keep string) (stop func()) {
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
				err := s.store.ExtendClaim(ctx, queue, id, s.leaseUntil(now))
				if keep != "" && err == nil {
					err = s.recovery.reg.KeepMarker(ctx, keep, s.markerTTL())
				}
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
func (s *Server) pass(ctx context.Context, g *lock.TaskGrant, drop *string) *lock.TaskGrant {
	s.recovery.left(g.Resource, g.Queue, g.ID) // not run here
	r, err := s.locker.HandOn(context.WithoutCancel(ctx), s.locker.Adopt(g, g.TTL), lock.HandOff{Chain: true, Drop: *drop, Holds: s.recovery.reg.Holds()})
	if err != nil {
		s.log.Warn("handing the lock past a waiter failed; it expires within its TTL", "resource", g.Resource, "err", err)
		return nil
	}
	if r.Dropped {
		*drop = ""
	}
	return r.Next
}

// deliver leaves g's task to asynq: it grants the lock to the task and
// moves the task to the head of its queue, so that whichever worker takes
// it takes the lock over (Locker.Take). For a chain that stops, a task this
// worker has no handler for, and one still on its way to the retry set
// (then it is woken once there, within the grant's TTL).
func (s *Server) deliver(ctx context.Context, g *lock.TaskGrant) {
	s.recovery.left(g.Resource, g.Queue, g.ID) // not run here
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := s.locker.Grant(gctx, g); err != nil {
		s.log.Warn("granting the lock to the next waiter failed; it expires within its TTL", "resource", g.Resource, "err", err)
		return
	}
	if s.wake(gctx, g.Resource, g.Queue, g.ID) != asynqstore.WokenActive {
		return
	}
	s.bg.Go(func() {
		if s.wakeOnceParked(context.Background(), g.Queue, g.ID, g.TTL) {
			s.log.Info("granted task still active when its grant expired; the next waiter takes the lock", "resource", g.Resource, "id", g.ID)
		}
	})
}

// wakeOnceParked wakes task id of queue again, paced by parking, while it is
// still active (on its way to the retry set after its handler returned), for
// at most within. It reports whether the task was still active then (its
// worker died in the moment of parking it: a recoverer brings it back).
func (s *Server) wakeOnceParked(ctx context.Context, queue, id string, within time.Duration) bool {
	return s.wakeParked(ctx, queue, id, within, s.store.Wake)
}

// wakeParked is wakeOnceParked with the wake to use (Wake, WakeLast).
func (s *Server) wakeParked(ctx context.Context, queue, id string, within time.Duration,
	wake func(context.Context, string, string) (asynqstore.Woken, error)) bool {
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var wait time.Duration
	for {
		wait = parking.Next(wait)
		if !backoff.Sleep(wctx, wait) {
			return ctx.Err() == nil // within passed with the task still active
		}
		if w, err := wake(wctx, queue, id); err != nil || w != asynqstore.WokenActive {
			return err != nil && wctx.Err() != nil && ctx.Err() == nil // the last look ran out of time
		}
	}
}

// runChained runs a claimed task under the lock handed on to it, g: it
// takes the grant over (Locker.TakeOver, its rate decided with it), runs
// the handler, and ends the hold with the hand-on (release). It returns the
// next grant and the hold that handed it on, and the task when asynq still
// has to complete it; ran is false when the task is not run here (no
// handler, its payload names another resource now, its rate turn is
// further off): the caller leaves it to asynq with the lock granted to it.
func (s *Server) runChained(ctx context.Context, g *lock.TaskGrant, from trace.SpanContext, keep string, msg []byte, drop *string) (next *lock.TaskGrant, nextFrom trace.SpanContext, done *finished, ran bool) {
	s.recovery.back(g.Resource, g.Queue, g.ID) // the hand-off recorded it anew
	m, err := asynqstore.DecodeTaskMsg(msg)
	var spec *Spec
	if err == nil {
		var ok bool
		if spec, ok = s.registry.Lookup(m.Type); !ok {
			err = fmt.Errorf("no handler for task type %q on this worker", m.Type)
		}
	}
	var payload any
	if err == nil {
		if payload, err = spec.Decode(m.Payload); err == nil && spec.Resource != nil && spec.Resource(payload) != g.Resource {
			err = errors.New("its payload names another resource now")
		}
	}
	if err != nil {
		s.log.Info("handed-on task not run here; left to asynq", "resource", g.Resource, "id", g.ID, "err", err)
		return nil, trace.SpanContext{}, nil, false
	}
	job := Job{ID: m.ID, Type: m.Type, Queue: m.Queue, Attempt: m.Retried + 1, MaxRetry: m.Retry}
	rate := s.taskRate(spec, job, payload, false) // a run is never parked: it waits under its run lock
	job.Resource = g.Resource
	t, err := s.locker.TakeOver(ctx, g, min(cmp.Or(spec.TTL, s.cfg.LockTTL), g.TTL), rate)
	if t.Waited > 0 {
		s.rateLimited(job.Type, t.Waited)
	}
	if t.Lease == nil {
		// Its rate turn is further off (or the rate or the lock could not
		// be asked): left to asynq with the lock granted to it, it is
		// delayed to its turn by its take (one admission).
		s.log.Debug("handed-on task over its rate limit; left to asynq with its lock", "resource", g.Resource, "id", g.ID, "err", err)
		return nil, trace.SpanContext{}, nil, false
	}
	if rate != nil {
		s.admitted(ctx, &job, rate.Key, t.Admitted)
	}
	s.lockAcquire(metrics.AcquireAcquired)
	rctx, cancel := m.Context(ctx) // its own timeout and deadline, as asynq bounds a run
	rctx, span := s.trace.StartJob(rctx, tracing.JobRun{ID: job.ID, Type: job.Type, Queue: job.Queue, Attempt: job.Attempt,
		Headers: m.Headers, HandedOnBy: from}) // tracing
	rctx, wait := s.trace.StartWait(rctx, job.Resource) // tracing
	wait.Granted()
	stop := s.keepClaim(m.Queue, m.ID, keep)
	h := &handoff{chained: true, drop: *drop, keep: keep}
	err = s.run(rctx, spec, job, payload, t.Lease, h)
	span.End(jobOutcome(span, err), failed(err)) // tracing
	stop()
	cancel()
	if h.dropped {
		*drop = ""
	}
	if err == nil {
		return h.next, h.from, &finished{queue: m.Queue, id: m.ID, unique: m.UniqueKey, marker: h.marker,
			retention: time.Duration(m.Retention) * time.Second, msg: msg}, true
	}
	// asynq does the rest: a failure's retry or archive (the marker
	// replays the outcome), or a run that was interrupted (no marker: it
	// runs again).
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	if _, werr := s.store.Wake(wctx, m.Queue, m.ID); werr != nil {
		s.log.Warn("returning a handed-on task to asynq failed; it comes back when its lease passes", "id", m.ID, "err", werr)
	}
	wcancel()
	return h.next, h.from, nil, true
}
