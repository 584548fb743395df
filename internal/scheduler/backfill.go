package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/script"
)

// LeaderBackfill is the leader of a backfilled tick in the schedule's history.
const LeaderBackfill = "backfill"

// DefaultBackfillMax bounds the ticks of one backfill unless told otherwise.
const DefaultBackfillMax = 1000

// backfillGrace is how long a backfilled run, registered before its
// enqueue, counts as queued while asynq does not know it yet.
const backfillGrace = 30 * time.Second

// Results of a backfilled tick.
const (
	BackfillEnqueued  = "enqueued"        // enqueued now, with the tick's own task id
	BackfillExists    = "exists"          // its task id was enqueued already (by the scheduler or a backfill)
	BackfillSkipped   = "skipped_overlap" // the overlap policy skipped it: an earlier run was queued or running
	BackfillScheduler = "scheduler"       // after the schedule's watermark, or pending: the scheduler enqueues it
	BackfillWould     = "would_enqueue"   // dry run: it would be enqueued (unless the overlap policy skips it)
)

// ErrBadBackfill is the error of a backfill refused as a whole (a bad range
// or bound); nothing was enqueued.
var ErrBadBackfill = errors.New("bad backfill")

// BackfillOptions bound and direct a backfill.
type BackfillOptions struct {
	DryRun bool // only report the ticks
	Max    int  // most ticks the range may hold; 0: DefaultBackfillMax
	// TaskRetention is the scheduler's task_retention (0: its default): how
	// long a tick's task id is known. Older ticks are refused.
	TaskRetention time.Duration
	Now           time.Time // zero: time.Now()
}

// BackfillTick is one tick of a backfill.
type BackfillTick struct {
	Tick   time.Time
	TaskID string
	Result string // a Backfill* result
}

// Backfill enqueues each tick of the schedule in [from, to] once, with the
// tick's own task id "<schedule>:<unix seconds>", applying the schedule's
// overlap policy, oldest first.
//
// A tick is enqueued at most once (G1): a tick after the schedule's
// watermark (the latest tick a replica claimed or skipped), or claimed and
// not yet enqueued, is left to the scheduler, which never claims a tick at
// or before the watermark; a tick that the scheduler or an earlier backfill
// enqueued is known by its task id, which asynq keeps for task_retention
// after the task completes. A tick older than that could have been enqueued
// and forgotten, so a range reaching further back than task_retention is
// refused, as are a range after now, from after to, and a range of more
// than Max ticks: all with ErrBadBackfill, before anything is enqueued.
func (st *Store) Backfill(ctx context.Context, name string, file []config.Schedule, from, to time.Time, o BackfillOptions) ([]BackfillTick, error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	limit := cmp.Or(o.Max, DefaultBackfillMax)
	retention := cmp.Or(o.TaskRetention, config.DefaultTaskRetention)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("schedules: backfill %s: %w: %s", name, ErrBadBackfill, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Max < 0:
		return nil, bad("--max must be greater than 0, got %d", o.Max)
	case from.After(to):
		return nil, bad("--from %s is after --to %s", from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	case to.After(now):
		return nil, bad("--to %s is in the future: those ticks are the scheduler's", to.UTC().Format(time.RFC3339))
	case from.Before(now.Add(-retention)):
		return nil, bad("--from %s is more than task_retention (%v) ago: an older tick may have run and been forgotten",
			from.UTC().Format(time.RFC3339), retention)
	}
	s, _, err := st.lookup(ctx, name, file)
	if err != nil {
		return nil, fmt.Errorf("schedules: backfill %s: %w", name, err)
	}
	e, err := newEntry(s, st.prefix, 1)
	if err != nil {
		return nil, fmt.Errorf("schedules: backfill %s: %w", name, err)
	}
	ticks, n, _ := between(e.spec, from.Add(-time.Second), to, limit+1)
	if n > limit {
		return nil, bad("the range holds more than --max %d ticks", limit)
	}

	// The ticks the scheduler still has: after the watermark (or the spec's
	// start, since), or pending.
	var state *redis.MapStringStringCmd
	var metaRaw *redis.StringCmd
	_, err = st.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		state = p.HGetAll(ctx, e.keys.state)
		metaRaw = p.HGet(ctx, st.k.meta, name)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("schedules: backfill %s: %w", name, err)
	}
	w, hasW := int64(0), false
	if v, ok := state.Val()["tick"]; ok {
		w, _ = strconv.ParseInt(v, 10, 64)
		hasW = true
	}
	var m meta
	if json.Unmarshal([]byte(metaRaw.Val()), &m) == nil && m.Since > 0 {
		w, hasW = max(w, m.Since), true
	}
	insp := asynq.NewInspectorFromRedisClient(st.client)
	ok := overlap.KeysFor(st.prefix, name)
	out := make([]BackfillTick, 0, len(ticks))
	for _, t := range ticks {
		id := TaskID(name, t)
		bt := BackfillTick{Tick: t.UTC(), TaskID: id}
		_, pending := state.Val()[pendingField(t.Unix())]
		switch {
		case hasW && t.Unix() > w, pending:
			bt.Result = BackfillScheduler
		case o.DryRun:
			bt.Result = BackfillWould
			if _, err := insp.GetTaskInfo(s.Queue, id); err == nil {
				bt.Result = BackfillExists
			}
		default:
			bt.Result, err = st.backfillOne(ctx, e, ok, t, retention)
			if err != nil {
				return out, err
			}
		}
		out = append(out, bt)
	}
	return out, nil
}

// backfillOne applies e's overlap policy to tick t and enqueues it.
func (st *Store) backfillOne(ctx context.Context, e *entry, k overlap.Keys, t time.Time, retention time.Duration) (string, error) {
	id := TaskID(e.name, t)
	if e.def.Overlap != config.OverlapAllow {
		insp := asynq.NewInspectorFromRedisClient(st.client)
		d, err := overlap.Tick(ctx, st.client, insp, st.runs, k, e.keys.state, e.def.Overlap, e.queue, id, backfillGrace, minStateTTL)
		if err != nil {
			return "", fmt.Errorf("schedules: backfill %s: tick %s: %w", e.name, t.UTC().Format(time.RFC3339), err)
		}
		if !d.Run {
			st.record(ctx, e.name, tickRecord{Tick: t.Unix(), State: TickSkipped, Reason: ReasonOverlap, Leader: LeaderBackfill, TaskID: id})
			return BackfillSkipped, nil
		}
	}
	opts := []asynq.Option{asynq.TaskID(id), asynq.Queue(e.queue), asynq.MaxRetry(e.maxRetry), asynq.Retention(retention)}
	if e.timeout > 0 {
		opts = append(opts, asynq.Timeout(e.timeout))
	}
	task := asynq.NewTaskWithHeaders(e.task, e.payload, overlap.Headers(e.name, e.def.Overlap))
	_, err := st.enq.EnqueueContext(ctx, task, opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return BackfillExists, nil
	case err != nil:
		return "", fmt.Errorf("schedules: backfill %s: tick %s: %w", e.name, t.UTC().Format(time.RFC3339), err)
	}
	// Recorded and counted in one step (backfilled.lua); a backfill that dies
	// between the enqueue and this leaves the tick enqueued, unrecorded and
	// uncounted.
	rec := tickRecord{Tick: t.Unix(), State: TickDone, Leader: LeaderBackfill, TaskID: id, LateMS: time.Since(t).Milliseconds()}
	if _, err := script.Run(ctx, st.client, scriptBackfilled, "backfilled", []string{e.keys.state, e.keys.history},
		rec.json(), historyLen, minStateTTL.Milliseconds()); err != nil {
		return "", fmt.Errorf("schedules: backfill %s: tick %s enqueued, its record failed: %w", e.name, t.UTC().Format(time.RFC3339), err)
	}
	return BackfillEnqueued, nil
}
