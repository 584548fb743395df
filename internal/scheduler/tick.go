package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// kind is why a replica fires a tick.
type kind int

const (
	onTime   kind = iota // the tick is due on this replica's clock
	catchUp              // the catch-up policy chose the tick after an outage
	takeover             // the tick is pending: its leader may have died
)

func (k kind) String() string {
	return [...]string{"on_time", "catch_up", "takeover"}[k]
}

// Claim outcomes: the first element of claim.lua's reply.
const (
	claimDone  = 0
	claimFresh = 1
	claimTaken = 2
	claimHeld  = 3
	claimEarly = 4
)

type claimReply struct {
	code       int64
	prevTick   string // claimFresh: the watermark before, "" if none
	prevLeader string // claimFresh: the replica that claimed prevTick
	n          int64  // claimHeld: lease left in ms; claimEarly: server time in ms
}

// Roles of a claim (claim.lua).
const (
	roleClaim    = "0" // a takeover or a catch-up
	roleFollower = "1" // not the tick's first claimer, on time: checks whether the tick was claimed, unless nobody did
	roleFirst    = "2" // the tick's first claimer, on time: counted in the claim digest of the tick's second
)

func (s *Scheduler) claim(ctx context.Context, e *entry, tick int64, token, role string) (claimReply, error) {
	var lead []string // the claim digests of tick's second, when kept
	keep := ""
	if s.digests != "" {
		lead, keep = []string{s.digests + strconv.FormatInt(tick, 10)}, "1"
	}
	res, err := s.scripts.runBatched(ctx, "claim", e.name, scriptClaim, &batchItem{
		lead: lead,
		keys: []string{e.keys.state, e.keys.history},
		args: []any{token, e.digest},
		common: []any{s.lease.Milliseconds(), s.stateTTL.Milliseconds(), s.id, (s.skew + claimMargin).Milliseconds(),
			keep, digestTTL.Milliseconds(), tick, role},
	})
	if err != nil {
		return claimReply{}, err
	}
	a, ok := res.([]any)
	if !ok || len(a) == 0 {
		return claimReply{}, fmt.Errorf("scheduler: claim %s: unexpected reply %v", e.name, res)
	}
	r := claimReply{}
	r.code, _ = a[0].(int64)
	switch r.code {
	case claimFresh:
		if len(a) == 3 {
			r.prevTick, _ = a[1].(string)
			r.prevLeader, _ = a[2].(string)
		}
	case claimHeld, claimEarly:
		if len(a) == 2 {
			r.n, _ = a[1].(int64)
		}
	}
	return r, nil
}

// fire claims tick t of e and, if this replica wins it, enqueues its task and
// marks it done. It returns an error only when the claim could not be made
// (Redis unreachable); a failure after the claim leaves the tick pending for
// a takeover.
func (s *Scheduler) fire(ctx context.Context, e *entry, t time.Time, k kind) (err error) {
	tick := t.Unix()
	ctx, span := s.trace.StartTick(ctx, e.name, t, s.id) // tracing: the outcome is set where it is decided
	defer func() { span.Fail(err); span.End() }()
	if k == takeover && s.clock.Now().Sub(t) > s.horizon {
		return s.drop(ctx, e, t, span)
	}
	finished := false
	defer func() {
		if !finished { // another replica has the tick, or it stays pending: sweep e
			e.unsettle(tick)
		}
	}()
	role := roleClaim
	if k == onTime {
		role = roleFirst
		if !s.first(e.name) {
			role = roleFollower
		}
	}
	follower := role == roleFollower
	if follower {
		// Another replica claims this tick first; claim it only if that one
		// has not (the claim then answers at once, done or held).
		tm := time.NewTimer(claimGrace)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil
		}
		if s.claimedByFirst(ctx, e, t) {
			span.Outcome(tracing.TickFollower)
			s.count(e, t, ResultFollower, 1)
			return nil
		}
		s.followerChecks.Add(1)
	}
	token := s.id + "/" + strconv.FormatUint(s.seq.Add(1), 10)

	// A takeover tries once: the next sweep tries again.
	cctx, cancel := context.WithTimeout(ctx, s.lateAfter)
	defer cancel()
	var r claimReply
	var sent time.Time
	claimOnce := func(ctx context.Context) (err error) {
		sent = time.Now()
		r, err = s.claim(ctx, e, tick, token, role)
		return err
	}
	if k == takeover {
		err = claimOnce(cctx)
	} else {
		err = retry(cctx, claimOnce)
	}
	if err != nil {
		return err
	}

	switch r.code {
	case claimDone, claimHeld:
		finished = r.code == claimDone && !follower // a follower's "done" may be pending
		span.Outcome(tracing.TickFollower)
		if k != takeover {
			s.count(e, t, ResultFollower, 1)
		}
		return nil
	case claimEarly:
		if last := s.earlyLogged.Load(); time.Since(time.Unix(0, last)) > time.Minute && s.earlyLogged.CompareAndSwap(last, time.Now().UnixNano()) {
			s.log.Error("clock ahead of Redis by more than max_clock_skew + 1s; not claiming (logged once a minute)",
				"schedule", e.name, "tick", t, "redis_time", time.UnixMilli(r.n).UTC(), "max_clock_skew", s.skew)
		}
		span.Outcome(tracing.TickEarly)
		s.emit(e, t, "early", 0, 0)
		return nil
	case claimFresh:
		if r.prevLeader != "" && r.prevLeader != s.id {
			s.m.SchedulerLeaderChanges.Inc()
		}
		if prev, err := strconv.ParseInt(r.prevTick, 10, 64); err == nil || e.since > 0 {
			prev = max(prev, e.since) // ticks before a spec change are not due
			// Ticks between the old watermark and t were claimed by nobody:
			// the catch-up policy dropped them, or they were lost in a stall.
			if _, n, _ := between(e.spec, time.Unix(prev, 0), t.Add(-time.Second), 0); n > 0 {
				s.count(e, t, ResultMissed, n)
			}
		}
	case claimTaken:
		if k == takeover {
			s.log.Warn("took over unfinished tick", "schedule", e.name, "tick", t)
		}
	default:
		return fmt.Errorf("scheduler: claim %s: unknown reply code %d", e.name, r.code)
	}

	// The claim and enqueue lines are each replica's own record of its ticks
	// (the chaos checker reads them; G1 in the README's guarantees).
	s.log.Debug("tick claimed", "schedule", e.name, "tick", tick, "kind", k.String())
	if h := s.hooks.afterClaim; h != nil && h(e.name, t) {
		s.crash()
		return nil
	}
	if e.def.Overlap != config.OverlapAllow {
		run, err := s.overlapCheck(ctx, e, t)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("overlap check failed; the tick stays pending for a takeover", "schedule", e.name, "tick", t, "err", err)
			}
			return nil
		}
		if !run {
			s.log.Debug("tick skipped", "schedule", e.name, "tick", tick, "kind", k.String(), "reason", ReasonOverlap)
			finished = s.done(ctx, e, tick, tickRecord{Tick: tick, State: TickSkipped, Reason: ReasonOverlap, Leader: s.id, TaskID: TaskID(e.name, t)})
			s.m.SchedulerTicks.WithLabelValues(e.label, ResultSkippedOverlap).Inc()
			s.emit(e, t, ResultSkippedOverlap, 1, 0)
			return nil
		}
	}
	result, late, ok := s.enqueue(ctx, e, t, k, sent)
	if !ok {
		return nil
	}
	s.log.Debug("tick enqueued", "schedule", e.name, "tick", tick, "kind", k.String(), "result", result)
	span.Outcome(tickOutcome(result, k))
	if h := s.hooks.afterEnqueue; h != nil && h(e.name, t) {
		s.crash()
		return nil
	}
	finished = s.done(ctx, e, tick, tickRecord{Tick: tick, State: TickDone, Leader: s.id, TaskID: TaskID(e.name, t), LateMS: late.Milliseconds()})
	s.m.SchedulerTicks.WithLabelValues(e.label, result).Inc()
	s.emit(e, t, result, 1, late)
	return nil
}

// tickOutcome is the tick span's lockstep.outcome of an enqueue's result.
func tickOutcome(result string, k kind) string {
	switch {
	case result == ResultEnqueued && k == takeover:
		return tracing.TickTakenOver
	case result == ResultCaughtUp:
		return tracing.TickCaughtUp
	case result == ResultDuplicate:
		return tracing.TickDuplicate
	}
	return tracing.TickEnqueued
}

// TaskID returns the asynq task id of schedule's tick at t: "<name>:<unix>".
func TaskID(schedule string, t time.Time) string {
	return schedule + ":" + strconv.FormatInt(t.Unix(), 10)
}

// overlapCheck applies e's overlap policy to its tick t (internal/overlap):
// run is false when the tick is to be skipped; true registers the tick's
// run, to be enqueued.
func (s *Scheduler) overlapCheck(ctx context.Context, e *entry, t time.Time) (run bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, s.lease)
	defer cancel()
	var d overlap.Decision
	err = retry(cctx, func(ctx context.Context) (err error) {
		d, err = overlap.Tick(ctx, s.client, s.insp, s.store.runs, overlap.KeysFor(s.prefix, e.name), e.keys.state, e.def.Overlap,
			e.queue, TaskID(e.name, t), s.lease, s.stateTTL)
		return err
	})
	if err != nil {
		return false, err
	}
	if d.Cancelled > 0 {
		s.log.Info("cancelled the previous run for the new tick", "schedule", e.name, "tick", t, "cancelled", d.Cancelled)
	}
	if !d.Run { // the record, the metric and the debug line "tick skipped" tell; no line per tick at info
		s.log.Debug("an earlier run is queued or running", "schedule", e.name, "tick", t,
			"overlap", string(e.def.Overlap), "queued", d.Queued, "running", d.Running)
	}
	return d.Run, nil
}

// enqueue puts the tick's task into asynq, retrying until the lease taken at
// sent would end. The task id makes a second enqueue of the tick fail, for as
// long as the task is retained.
func (s *Scheduler) enqueue(ctx context.Context, e *entry, t time.Time, k kind, sent time.Time) (result string, late time.Duration, ok bool) {
	id := TaskID(e.name, t)
	ctx, span, headers := s.trace.StartEnqueue(ctx, e.queue, id) // tracing: the context travels in the headers
	defer span.End()
	task := asynq.NewTaskWithHeaders(e.task, e.payload, overlap.WithHeaders(headers, e.name, e.def.Overlap))
	opts := []asynq.Option{
		asynq.TaskID(id),
		asynq.Queue(e.queue),
		asynq.MaxRetry(e.maxRetry),
		asynq.Retention(s.retention),
	}
	if e.timeout > 0 {
		opts = append(opts, asynq.Timeout(e.timeout))
	}
	ectx, cancel := context.WithDeadline(ctx, sent.Add(s.lease))
	defer cancel()
	result = ResultEnqueued
	if k == catchUp {
		result = ResultCaughtUp
	}
	err := retry(ectx, func(ctx context.Context) error {
		_, err := s.enq.EnqueueContext(ctx, task, opts...)
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			result = ResultDuplicate
			return nil
		}
		return err
	})
	if err != nil {
		span.Fail(err)
		if ctx.Err() == nil {
			s.log.Error("enqueue failed; the tick stays pending for a takeover", "schedule", e.name, "tick", t, "err", err)
		}
		return "", 0, false
	}
	late = s.clock.Now().Sub(t)
	if result == ResultEnqueued {
		tracing.Observe(ctx, s.m.SchedulerTickLateness, late.Seconds()) // the trace id as exemplar
	}
	if result == ResultDuplicate {
		s.log.Warn("tick was enqueued already", "schedule", e.name, "tick", t, "kind", k.String())
	}
	return result, late, true
}

// done ends the tick's lease: it is pending no more. If that fails, the
// tick stays pending: a takeover then finds its task id and marks it done.
// It reports whether the tick is done.
func (s *Scheduler) done(ctx context.Context, e *entry, tick int64, rec tickRecord) bool {
	dctx, cancel := context.WithTimeout(ctx, s.lease)
	defer cancel()
	err := retry(dctx, func(ctx context.Context) error {
		_, err := s.scripts.runBatched(ctx, "done", e.name, scriptDone, s.doneItem(e, tick, rec))
		return err
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("marking tick done failed; a takeover will finish it", "schedule", e.name, "tick", tick, "err", err)
	}
	return err == nil
}

// drop removes a pending tick too old to take over safely: its task id may
// have expired from asynq, so enqueuing it again could duplicate it.
func (s *Scheduler) drop(ctx context.Context, e *entry, t time.Time, span *tracing.Span) error {
	tick := t.Unix()
	res, err := s.scripts.runBatched(ctx, "drop", e.name, scriptDone,
		s.doneItem(e, tick, tickRecord{Tick: tick, State: TickMissed, TaskID: TaskID(e.name, t)}))
	if err != nil {
		return err
	}
	if res != int64(1) {
		return nil // another replica dropped it
	}
	span.Outcome(tracing.TickMissed)
	s.log.Error("dropped unfinished tick older than the takeover horizon", "schedule", e.name, "tick", t, "horizon", s.horizon)
	s.count(e, t, ResultMissed, 1)
	return nil
}

// doneItem is one tick's part of a batched done.lua call.
func (s *Scheduler) doneItem(e *entry, tick int64, rec tickRecord) *batchItem {
	return &batchItem{
		keys:   []string{e.keys.state, e.keys.history},
		args:   []any{rec.json()},
		common: []any{historyLen, s.stateTTL.Milliseconds(), tick},
	}
}
