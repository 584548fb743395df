package scheduler

import (
	"context"
	"encoding/json"

	"github.com/redis/go-redis/v9"
)

// States of a tick in a schedule's history (lockstep ticks).
const (
	TickDone    = "done"    // its task was enqueued (or existed already)
	TickPending = "pending" // claimed, not yet done
	TickSkipped = "skipped" // dropped on purpose by the catch-up policy (or a pause)
	TickMissed  = "missed"  // nobody could enqueue it in time (too old to take over)
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
	Count  int    `json:"n,omitempty"`       // skipped or missed: how many ticks up to Tick
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
		return nil
	})
}
