package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// scanBudget bounds how many ticks one enumeration walks before it starts
// jumping ahead (a schedule every second that was down for a year).
const scanBudget = 10_000

// catchUp applies e's catch-up policy to the ticks after the schedule's
// watermark up to cutoff: ticks that no replica claimed while they were due.
// On an error (Redis unreachable) the caller tries again at its next tick.
func (s *Scheduler) catchUp(loops, fires context.Context, e *entry, cutoff time.Time) error {
	if loops.Err() != nil {
		return nil
	}
	w, ok, err := s.watermark(fires, e)
	if err != nil {
		return fmt.Errorf("catch-up: read watermark: %w", err)
	}
	if since := time.Unix(e.since, 0).UTC(); e.since > 0 && (!ok || w.Before(since)) {
		w, ok = since, true // a changed spec's ticks before the change are not due
	}
	if !ok || !w.Before(cutoff) {
		return nil // a new schedule, or nothing missed
	}
	ticks, n, exact := between(e.spec, w, cutoff, e.maxCatchUp)
	if n == 0 {
		return nil
	}
	var chosen []time.Time
	switch e.catchUp {
	case config.CatchUpOnce:
		chosen = ticks[len(ticks)-1:]
	case config.CatchUpAll:
		chosen = ticks
	}
	s.log.Info("catching up", "schedule", e.name, "policy", string(e.catchUp), "missed_since", w,
		"ticks", n, "exact", exact, "enqueue", len(chosen))
	if len(chosen) == 0 {
		if err := s.skip(fires, e, ticks[len(ticks)-1]); err != nil {
			return fmt.Errorf("catch-up: %w", err)
		}
	}
	for _, t := range chosen {
		if loops.Err() != nil {
			return nil
		}
		if err := s.fire(fires, e, t, catchUp); err != nil {
			return fmt.Errorf("catch-up: tick %v: %w", t.UTC(), err)
		}
	}
	s.emit(e, cutoff, "caught_up_done", 0, 0)
	return nil
}

// watermark returns the schedule's highest claimed or skipped tick; ok is
// false when there is none (a new schedule, or one idle past its state TTL).
func (s *Scheduler) watermark(ctx context.Context, e *entry) (time.Time, bool, error) {
	v, err := s.client.HGet(ctx, e.keys.state, "tick").Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	} else if err != nil {
		return time.Time{}, false, err
	}
	u, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false, err
	}
	return time.Unix(u, 0).UTC(), true, nil
}

// skip moves the watermark over the ticks up to last, which the policy
// drops, and counts those this call moved it over as missed.
func (s *Scheduler) skip(ctx context.Context, e *entry, last time.Time) (err error) {
	ctx, span := s.trace.StartTick(ctx, e.name, last, s.id) // tracing: the last tick skipped
	defer func() { span.Fail(err); span.End() }()
	res, err := s.scripts.run(ctx, "skip", e.name, scriptSkip, []string{e.keys.state, e.keys.history}, last.Unix(), s.stateTTL.Milliseconds(), historyLen)
	if err != nil {
		return err
	}
	a, _ := res.([]any)
	if len(a) != 2 || a[0] != int64(1) {
		span.Outcome(tracing.TickFollower)
		return nil // another replica moved it
	}
	span.Outcome(tracing.TickSkipped)
	prev, _ := a[1].(string)
	if u, err := strconv.ParseInt(prev, 10, 64); err == nil {
		_, n, _ := between(e.spec, time.Unix(u, 0), last, 0)
		s.count(e, last, ResultMissed, n)
	}
	return nil
}

// between returns the last keep ticks of s in (after, until], oldest first,
// and how many ticks that interval holds. The count is exact unless the walk
// exceeded scanBudget ticks; it then jumps ahead, halving what is left, so
// that it stays cheap, and n is a lower bound (exact is false).
func between(s Spec, after, until time.Time, keep int) (last []time.Time, n int, exact bool) {
	exact = true
	ring := make([]time.Time, 0, keep)
	t, steps := after, 0
	for {
		next := s.Next(t)
		if next.IsZero() || next.After(until) {
			break
		}
		if steps == scanBudget {
			exact, steps = false, 0
			t = t.Add(until.Sub(t) / 2).Truncate(time.Second)
			continue
		}
		steps++
		n++
		if keep > 0 {
			if len(ring) == keep {
				ring = append(ring[:0], ring[1:]...)
			}
			ring = append(ring, next)
		}
		t = next
	}
	return ring, n, exact
}
