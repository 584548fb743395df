package asynqstore

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/script"
)

var (
	//go:embed lua/park.lua
	parkLua    string
	scriptPark = script.New("asynqstore/park.lua", parkLua)
)

// Seen is a task of a queue as Next found it.
type Seen struct {
	ID     string
	Msg    TaskMsg
	Active bool // taken by a worker (asynq's active list); else pending
}

// Next returns, in the order asynq's enqueues put them, the last active
// tasks of queue taken (up to active of them, the newest of asynq's active
// list) and then the next pending ones (up to pending, the next to be
// dequeued first: asynq dequeues from the list's right end), with their
// messages: one round trip for the ids, one for the messages of those skip
// does not leave out (skip may be nil). A task gone or undecodable
// meanwhile is left out.
func (s *Store) Next(ctx context.Context, queue string, active, pending int, skip func(id string) bool) ([]Seen, error) {
	p := queuePrefix(queue)
	var act, pend *redis.StringSliceCmd
	_, err := s.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		act = pl.LRange(ctx, p+"active", 0, int64(active-1))
		pend = pl.LRange(ctx, p+"pending", int64(-pending), -1)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("asynq next tasks: %w", err)
	}
	ids := act.Val()
	slices.Reverse(ids) // the active list is pushed on the left: oldest first now
	nActive := len(ids)
	next := pend.Val()
	slices.Reverse(next)
	ids = append(ids, next...)
	if skip != nil {
		kept, actives := ids[:0], nActive
		for i, id := range ids {
			if !skip(id) {
				kept = append(kept, id)
			} else if i < actives {
				nActive--
			}
		}
		ids = kept
	}
	if len(ids) == 0 {
		return nil, nil
	}
	msgs := make([]*redis.StringCmd, len(ids))
	_, err = s.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, id := range ids {
			msgs[i] = pl.HGet(ctx, p+"t:"+id, "msg")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("asynq next tasks: %w", err)
	}
	out := make([]Seen, 0, len(ids))
	for i, c := range msgs {
		if c.Err() != nil {
			continue
		}
		m, err := DecodeTaskMsg([]byte(c.Val()))
		if err != nil {
			continue
		}
		out = append(out, Seen{ID: ids[i], Msg: m, Active: i < nActive})
	}
	return out, nil
}

// Park moves the tasks ids of queue that are still pending to asynq's
// retry set, until fallback at the latest (park.lua): no worker dequeues
// them before Wake brings each back. Their messages and retry counts stay;
// asynq's Inspector lists them as retry tasks. It returns those moved.
func (s *Store) Park(ctx context.Context, queue string, ids []string, fallback time.Time) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	p := queuePrefix(queue)
	args := make([]any, 0, 2+len(ids))
	args = append(args, p+"t:", fallback.Unix()+1)
	for _, id := range ids {
		args = append(args, id)
	}
	v, err := script.Run(ctx, s.client, scriptPark, "asynq park", []string{p + "pending", p + "retry"}, args...)
	vals, _ := v.([]any)
	var moved []string
	for _, x := range vals {
		if id, ok := x.(string); ok {
			moved = append(moved, id)
		}
	}
	return moved, err
}
