package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Fair share across tenants (Spec.Fair), decided before the rate, the lock
// and the handler, so that no worker slot is spent on a task that should
// wait (docs/design.md §3b):
//
//  1. Each delivery of a task of a fair type first reads the next tasks of
//     its queue (read-ahead, asynqstore.Next: asynq delivers in enqueue
//     order, and a tenant enqueued behind another's burst must be seen
//     before that burst has run) and gives each of the type a tag on the
//     scope's virtual clock (Locker.Fair, lua/fair.lua: start-time fair
//     queuing). Those that must wait are parked in asynq's retry set
//     (asynqstore.Park) without a worker ever taking them.
//  2. The delivered task runs if it was started for it before (woken on its
//     turn) or its tag is the smallest; otherwise it waits: it returns a
//     *FairWaitError (no failure, no attempt) and asynq parks it.
//  3. Every run's end starts the smallest tag for the slot it frees, a
//     delivery that waits one for its slot, and a server with idle slots
//     starts tasks for them (fairKick); starts for free slots go beyond
//     those still on their way to a worker only. A started task goes back
//     to the end of its queue (WakeLast), in the order started, and runs
//     on that delivery without asking again.
//
// A task parked for its turn is dequeued once to run (once more when it
// was delivered before the read-ahead saw it). A task that cannot go back
// to asynq (no retries left, a schedule's run) is not held back.

// fairReadAhead is how many of a queue's next pending tasks a decision
// reads, and fairActive how many of those its workers took last: a task
// taken at the same moment as the deciding one is tagged in its place.
const (
	fairReadAhead = 64
	fairActive    = 16
)

// fairFallback is a parked task's retry time, should its turn never be
// given (the scope's state lost); the scope's keys live twice as long.
const fairFallback = time.Minute

// fairTurn applies spec's fair share to job: a nil error runs it now (with
// counted, its run's end starts the next turn: fairDone); otherwise the
// task's result
// (a *FairWaitError parks it, an invalid payload is archived, a Redis error
// is retried soon).
func (s *Server) fairTurn(ctx context.Context, spec *Spec, job Job, payload any) (counted bool, err error) {
	if spec.Resource != nil && s.handsOff {
		// A task among its lock's waiters had its turn before it joined
		// them (it may hold a grant of the lock now): it is not held back.
		if resource := spec.Resource(payload); resource != "" {
			waiting, err := s.locker.Waiting(ctx, resource, job.Queue, job.ID, max(spec.Limit, 1))
			if err != nil {
				return false, soon(stepFair, job, err)
			}
			if waiting {
				return false, nil
			}
		}
	}
	return true, s.fairDecide(ctx, spec, job, payload)
}

// fairDecide asks job's turn (fairTurn).
func (s *Server) fairDecide(ctx context.Context, spec *Spec, job Job, payload any) error {
	tenant, weight := spec.Fair(payload)
	switch {
	case tenant == "":
		return s.invalid(job, errors.New("the fair share's tenant is empty"))
	case weight < 1 || weight > lock.MaxFairWeight:
		return s.invalid(job, fmt.Errorf("the fair share's weight %d is not within 1 to %d", weight, lock.MaxFairWeight))
	}
	self := lock.FairTask{ID: job.ID, Tenant: tenant, Weight: weight}
	// A task that cannot go back to asynq runs now (asynq archives one
	// that returns an error with no retries left; a run holds its lock).
	force := job.Attempt > job.MaxRetry || ctx.Value(inRunKey{}) != nil
	seen := s.seen(ctx, spec, job.Queue, self, force)
	f, err := s.fair(ctx, spec.Type, job.Queue, lock.FairAsk{Self: job.ID, Force: force, Seen: seen, Release: s.idleSlots()})
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return soon(stepFair, job, err)
	case f.Run:
		return nil
	}
	s.metrics.FairWaits.WithLabelValues(job.Type).Inc()
	s.log.Debug("task waits for its tenant's fair share", "type", job.Type, "id", job.ID, "tenant", tenant)
	return &FairWaitError{Tenant: tenant, Delay: fairFallback}
}

// fair runs one decision of the scope of typ in queue and carries it out:
// parks the tasks seen that wait, brings back those started.
func (s *Server) fair(ctx context.Context, typ, queue string, a lock.FairAsk) (lock.Fairness, error) {
	a.TTL = 2 * fairFallback
	f, err := s.runLocker().Fair(ctx, lock.FairScope(queue, typ), a)
	if err != nil {
		return f, err
	}
	// The tasks seen that wait are parked, and so are those started now
	// but still pending: every started task goes to the end of its queue
	// in the order started, so that none started later overtakes it.
	park := f.Park
	for _, id := range f.Started {
		if slices.ContainsFunc(a.Seen, func(t lock.FairTask) bool { return t.ID == id }) && id != a.Self {
			park = append(park, id)
		}
	}
	started := f.Started
	if len(park) > 0 {
		moved, err := s.store.Park(ctx, queue, park, time.Now().Add(fairFallback))
		if err != nil {
			s.log.Warn("parking tasks for their fair share failed; they run in their queue's order", "type", typ, "err", err)
		}
		waits := 0
		for _, id := range moved {
			if slices.Contains(f.Park, id) {
				waits++
			}
		}
		s.metrics.FairWaits.WithLabelValues(typ).Add(float64(waits))
		// A decision of another slot may have started one of them between
		// this decision and its park, and found it still pending: it is
		// brought back now (a second wake of a task already back does
		// nothing).
		again, err := s.runLocker().FairStarted(ctx, lock.FairScope(queue, typ), f.Park)
		if err != nil {
			s.log.Warn("reading a fair share's started tasks failed; a task started meanwhile comes back at its fallback", "type", typ, "err", err)
		}
		started = append(started, again...)
	}
	for _, id := range started {
		s.wakeStarted(ctx, queue, id)
	}
	return f, nil
}

// wakeStarted brings a started task back to the end of its queue; one
// still on its way to the retry set is woken once there.
func (s *Server) wakeStarted(ctx context.Context, queue, id string) {
	w, err := s.store.WakeLast(ctx, queue, id)
	switch {
	case err != nil:
		s.log.Warn("waking a task on its fair turn failed; it comes back at its fallback", "id", id, "err", err)
	case w == asynqstore.WokenActive && s.bgCtx != nil && s.bgCtx.Err() == nil:
		s.bg.Go(func() { s.wakeParked(s.bgCtx, queue, id, time.Second, s.store.WakeLast) })
	}
}

// fairSeenFor is how long this server remembers a task it showed a fair
// decision: a read-ahead does not read it again meanwhile (its decision
// keeps its tag, or knows it started). A task delivered is always shown.
const fairSeenFor = fairFallback

// fairSeenMax bounds the ids remembered; past it the oldest half goes.
const fairSeenMax = 100_000

// known reports whether this server showed task id of queue to a fair
// decision within fairSeenFor.
func (s *Server) known(queue, id string) bool {
	s.fairMu.Lock()
	defer s.fairMu.Unlock()
	at, ok := s.fairSeen[queue+"\x00"+id]
	return ok && time.Since(at) < fairSeenFor
}

// remember notes the tasks of queue shown to a fair decision.
func (s *Server) remember(queue string, ts []lock.FairTask) {
	now := time.Now()
	s.fairMu.Lock()
	defer s.fairMu.Unlock()
	if s.fairSeen == nil {
		s.fairSeen = map[string]time.Time{}
	}
	if len(s.fairSeen)+len(ts) > fairSeenMax {
		for k, at := range s.fairSeen {
			if now.Sub(at) >= fairSeenFor/2 {
				delete(s.fairSeen, k)
			}
		}
		if len(s.fairSeen)+len(ts) > fairSeenMax {
			clear(s.fairSeen)
		}
	}
	for _, t := range ts {
		s.fairSeen[queue+"\x00"+t.ID] = now
	}
}

// seen returns the tasks of spec's type that queue's workers took last and
// those next in it, in their enqueue order, with their tenants; self among
// them (first, when its workers have taken more since), unless it runs
// whatever its turn. One that does not decode is left to its delivery, one
// this server showed a decision lately is left out.
func (s *Server) seen(ctx context.Context, spec *Spec, queue string, self lock.FairTask, force bool) []lock.FairTask {
	next, err := s.store.Next(ctx, queue, fairActive, fairReadAhead, func(id string) bool {
		return id != self.ID && s.known(queue, id)
	})
	if err != nil {
		s.log.Warn("reading a queue's next tasks failed", "queue", queue, "err", err)
	}
	var out []lock.FairTask
	found := force
	for _, p := range next {
		if p.ID == self.ID {
			if !force {
				out, found = append(out, self), true
			}
			continue
		}
		if p.Msg.Type != spec.Type || p.Msg.Retried >= p.Msg.Retry {
			continue
		}
		payload, err := spec.Decode(p.Msg.Payload)
		if err != nil {
			continue
		}
		tenant, weight := spec.Fair(payload)
		if tenant == "" || weight < 1 || weight > lock.MaxFairWeight {
			continue
		}
		out = append(out, lock.FairTask{ID: p.ID, Tenant: tenant, Weight: weight})
	}
	if !found {
		out = append([]lock.FairTask{self}, out...)
	}
	s.remember(queue, out)
	return out
}

// idleSlots is how many of this server's worker slots run nothing (the
// calling one counts as running).
func (s *Server) idleSlots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.cfg.Concurrency-s.inflight, 0)
}

// fairDone ends the run of task id of the scope of typ in queue and starts
// the next waiting task for the slot that this run frees, and for any idle
// one.
func (s *Server) fairDone(ctx context.Context, typ, queue, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := s.fair(ctx, typ, queue, lock.FairAsk{Done: id, Release: s.idleSlots() + 1}); err != nil {
		s.log.Warn("starting the next fair turn failed; an idle worker starts it at its next poll", "type", typ, "err", err)
	}
}

// fairKickEvery is how often an idle server starts waiting tasks for its
// idle slots (at least its poll interval).
const fairKickEvery = 200 * time.Millisecond

// fairLate is how long after its start a task not yet delivered is woken
// again by a kick: its wake may have died with its worker.
const fairLate = 2 * time.Second

// fairKick starts waiting tasks of every fair scope for this server's idle
// slots, every fairKickEvery: the first tasks after a restart, those for
// the idle slots of a server whose queue another's read-ahead emptied, and
// any whose start was lost. It also wakes again the tasks started more than
// fairLate ago and not yet delivered (a wake does nothing to a task no
// longer parked).
func (s *Server) fairKick(ctx context.Context) {
	var types []string
	for _, t := range s.registry.Types() {
		if spec, _ := s.registry.Lookup(t); spec.Fair != nil {
			types = append(types, t)
		}
	}
	if len(types) == 0 {
		return
	}
	tick := time.NewTicker(max(s.cfg.PollInterval, fairKickEvery))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for queue := range s.cfg.Queues {
			for _, t := range types {
				kctx, cancel := context.WithTimeout(ctx, time.Second)
				late, err := s.runLocker().FairLate(kctx, lock.FairScope(queue, t), fairLate)
				if err == nil {
					for _, id := range late {
						if w, _ := s.store.WakeLast(kctx, queue, id); w == asynqstore.WokenMoved {
							s.log.Info("fair turn's task brought back: started and not delivered (its wake lost?)", "type", t, "id", id)
						}
					}
				}
				if idle := s.idleSlots(); idle > 0 {
					_, _ = s.fair(kctx, t, queue, lock.FairAsk{Release: idle})
				}
				cancel()
			}
		}
	}
}
