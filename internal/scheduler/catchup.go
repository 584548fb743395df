package scheduler

import (
	"context"
	"encoding/json"
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
	// The ticks the policy drops (all, or those before the chosen) are
	// skipped first, so that they are recorded with their reason.
	if len(chosen) < n {
		last := ticks[len(ticks)-1]
		if len(chosen) > 0 {
			before, _, _ := between(e.spec, w, chosen[0].Add(-time.Second), 1)
			last = time.Time{}
			if len(before) == 1 {
				last = before[0]
			}
		}
		if !last.IsZero() {
			if err := s.skip(fires, e, w, last); err != nil {
				return fmt.Errorf("catch-up: %w", err)
			}
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

// skip moves the watermark over the ticks after w up to last, which the
// policy drops, records them (reason paused for those due while the
// schedule was paused, else catch_up), and counts those this call moved it
// over: skipped_paused for the paused ones, missed for the others.
func (s *Scheduler) skip(ctx context.Context, e *entry, w, last time.Time) (err error) {
	ctx, span := s.trace.StartTick(ctx, e.name, last, s.id) // tracing: the last tick skipped
	defer func() { span.Fail(err); span.End() }()
	args := []any{last.Unix(), s.stateTTL.Milliseconds(), historyLen}
	runs := s.skipReasons(ctx, e, w, last)
	for _, r := range runs {
		args = append(args, r.last.Unix(), r.reason)
	}
	res, err := s.scripts.run(ctx, "skip", e.name, scriptSkip, []string{e.keys.state, e.keys.history}, args...)
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
		from := time.Unix(u, 0)
		missed, paused := 0, 0
		for _, r := range runs {
			if !r.last.After(from) {
				continue
			}
			_, n, _ := between(e.spec, from, r.last, 0)
			if r.reason == ReasonPaused {
				paused += n
			} else {
				missed += n
			}
			from = r.last
		}
		_, n, _ := between(e.spec, from, last, 0) // past the runs (or no pause on record)
		s.count(e, last, ResultMissed, missed+n)
		s.count(e, last, ResultSkippedPaused, paused)
	}
	return nil
}

// skipRun is a run of dropped ticks that share a reason, up to last.
type skipRun struct {
	last   time.Time
	reason string
}

// skipReasons splits the ticks in (w, last] into runs by reason, oldest
// first: paused for the ticks due between the schedule's last pause and its
// resume (the store's meta, on Redis's clock), catch_up for the others.
// Without a pause on record (or if the meta cannot be read) there is one
// run, catch_up.
func (s *Scheduler) skipReasons(ctx context.Context, e *entry, w, last time.Time) []skipRun {
	raw, err := s.client.HGet(ctx, s.store.k.meta, e.name).Result()
	var m meta
	if err != nil || json.Unmarshal([]byte(raw), &m) != nil || m.PausedMS == 0 {
		return nil
	}
	paused := time.UnixMilli(m.PausedMS)
	resumed := last // still paused (a pause that came while this catch-up ran)
	if m.ResumedMS > m.PausedMS {
		resumed = time.UnixMilli(m.ResumedMS)
	}
	var runs []skipRun
	add := func(after, until time.Time, reason string) {
		until = minTime(until, last)
		if !until.After(after) {
			return
		}
		if t, _, _ := between(e.spec, after, until, 1); len(t) == 1 {
			runs = append(runs, skipRun{last: t[0], reason: reason})
		}
	}
	add(w, paused, ReasonCatchUp)
	add(maxTime(w, paused), resumed, ReasonPaused)
	add(maxTime(w, resumed), last, ReasonCatchUp)
	return runs
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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
