package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// States of a tick in a schedule's history (lockstep ticks).
const (
	TickDone    = "done"    // its task was enqueued (or existed already)
	TickPending = "pending" // claimed, not yet done
	TickSkipped = "skipped" // dropped on purpose by the catch-up policy (or a pause)
	TickMissed  = "missed"  // nobody could enqueue it in time (too old to take over)
)

// Reasons of a skipped tick.
const (
	ReasonOverlap = "overlap"  // an earlier run was queued or running (the schedule's overlap policy)
	ReasonCatchUp = "catch_up" // missed in an outage, dropped by the catch-up policy
	ReasonPaused  = "paused"   // due while the schedule was paused, dropped by the catch-up policy at the resume
)

// historyLen is how many records a schedule's history keeps.
const historyLen = 100

// tickRecord is one entry of a schedule's history list, newest first.
type tickRecord struct {
	Tick   int64  `json:"t"`                 // scheduled time, Unix seconds (a trigger: when it was made)
	State  string `json:"s"`                 // a Tick* state
	Leader string `json:"l,omitempty"`       // replica that enqueued it ("trigger" for one by hand)
	TaskID string `json:"id,omitempty"`      // asynq task id
	LateMS int64  `json:"late_ms,omitempty"` // enqueue time − Tick
	From   int64  `json:"from,omitempty"`    // skipped: the ticks after From up to Tick
	Reason string `json:"r,omitempty"`       // skipped: a Reason*
}

func (r tickRecord) json() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// record adds r to the schedule's history (best effort: history is a view).
func (st *Store) record(ctx context.Context, schedule string, r tickRecord) {
	k := keysFor(st.prefix, schedule)
	_, _ = st.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, k.history, r.json())
		p.LTrim(ctx, k.history, 0, historyLen-1)
		p.PExpire(ctx, k.history, minStateTTL)
		return nil
	})
}

// Tick is one tick of a schedule, as Ticks reports it.
type Tick struct {
	Tick     time.Time     // scheduled time (a trigger: when it was made)
	State    string        // a Tick* state
	Leader   string        // replica that claimed it ("trigger" for one by hand)
	TaskID   string        // asynq task id
	Lateness time.Duration // done: enqueue time − Tick
	From     time.Time     // skipped: the ticks after From up to Tick were dropped
	Reason   string        // skipped: why, a Reason*
}

// Ticks returns the schedule's latest n ticks, newest first: those claimed
// and not yet done (pending), then its history of done, skipped and missed
// ticks and triggers.
func (st *Store) Ticks(ctx context.Context, schedule string, n int) ([]Tick, error) {
	k := keysFor(st.prefix, schedule)
	var state *redis.MapStringStringCmd
	var hist *redis.StringSliceCmd
	_, err := st.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		state = p.HGetAll(ctx, k.state)
		hist = p.LRange(ctx, k.history, 0, int64(n-1))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("schedules: ticks %s: %w", schedule, err)
	}
	var out []Tick
	for field, value := range state.Val() {
		u, _, token, ok := parsePending(field, value)
		if !ok {
			continue
		}
		leader, _, _ := strings.Cut(token, "/") // token: replica/sequence
		out = append(out, Tick{Tick: time.Unix(u, 0).UTC(), State: TickPending, Leader: leader, TaskID: TaskID(schedule, time.Unix(u, 0))})
	}
	for _, raw := range hist.Val() {
		var r tickRecord
		if json.Unmarshal([]byte(raw), &r) != nil {
			continue
		}
		t := Tick{Tick: time.Unix(r.Tick, 0).UTC(), State: r.State, Leader: r.Leader, TaskID: r.TaskID,
			Lateness: time.Duration(r.LateMS) * time.Millisecond, Reason: r.Reason}
		if r.State == TickSkipped && t.Reason == "" {
			t.Reason = ReasonCatchUp // recorded before reasons were
		}
		if r.From > 0 {
			t.From = time.Unix(r.From, 0).UTC()
		}
		out = append(out, t)
	}
	slices.SortStableFunc(out, func(a, b Tick) int { return cmp.Compare(b.Tick.Unix(), a.Tick.Unix()) })
	if len(out) > n {
		out = out[:n]
	}
	return out, nil
}
