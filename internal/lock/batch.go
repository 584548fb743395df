package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher folds concurrent calls of one multi-item script (acquire.lua,
// release.lua, rate.lua: each takes any number of locks or admissions, in
// groups of keys and values)
// into one call per round trip, the way renewals are batched. A caller that
// finds no call in flight sends its own at once, so a lone caller pays
// nothing; callers that arrive while one is in flight queue up, and the first
// of them sends the whole queue as one call when the call in flight returns.
// On one server that turns 64 concurrent cycles into a handful of script
// calls per round trip: fewer calls, fewer system calls on both sides.
//
// Only for one node that serves every key (a server, a Sentinel master): on
// a Cluster the keys of different locks live in different slots, and a
// script's keys must share one.
type batcher struct {
	client redis.Scripter
	script *redis.Script
	name   string // the operation, for errors

	mu       sync.Mutex
	inFlight bool
	queue    []*batchItem
}

// maxBatch bounds the locks of one call: a call blocks Redis while it runs.
const maxBatch = 256

type batchItem struct {
	ctx   context.Context
	keys  []string
	args  []any
	reply any
	err   error
	done  chan struct{}
	lead  []*batchItem // set when this item's caller is to send the batch
}

// do runs the script for one item and returns that item's reply.
func (b *batcher) do(ctx context.Context, keys []string, args []any) (any, error) {
	b.mu.Lock()
	if !b.inFlight {
		// Alone: the caller's own call, with its keys, values and context as
		// they are (nothing allocated or copied for the batch).
		b.inFlight = true
		b.mu.Unlock()
		reply, err := run(ctx, b.client, b.script, keys, args...)
		b.next()
		return reply, err
	}
	it := &batchItem{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	b.queue = append(b.queue, it)
	b.mu.Unlock()
	// Not bounded by ctx: once queued, the item may be sent at any moment,
	// and a caller that left could not undo an acquire it no longer knows of.
	// The wait is bounded by the call in flight (the client's timeouts).
	<-it.done
	if it.lead != nil {
		b.send(it.lead)
	}
	return it.reply, it.err
}

// send makes one call for batch, gives each item its reply, and hands the
// items queued meanwhile to the first of their callers to send.
func (b *batcher) send(batch []*batchItem) {
	live := make([]*batchItem, 0, len(batch))
	for _, it := range batch {
		if err := it.ctx.Err(); err != nil { // given up before it was sent
			it.err = err
			continue
		}
		live = append(live, it)
	}
	switch len(live) {
	case 0:
	case 1: // the script's reply for one lock is that lock's
		it := live[0]
		it.reply, it.err = run(it.ctx, b.client, b.script, it.keys, it.args...)
	default:
		var keys []string
		var args []any
		for _, it := range live {
			keys = append(keys, it.keys...)
			args = append(args, it.args...)
		}
		// The items' callers share the call: no single caller's cancellation
		// may fail the others, and it may take until the latest deadline.
		ctx, cancel := sharedContext(live)
		reply, err := run(ctx, b.client, b.script, keys, args...)
		cancel()
		vals, ok := reply.([]any)
		if err == nil && (!ok || len(vals) != len(live)) {
			err = fmt.Errorf("%s returned %v for %d items", b.name, reply, len(live))
		}
		for i, it := range live {
			if err != nil {
				it.err = err
			} else {
				it.reply = vals[i]
			}
		}
	}
	b.next()
	for _, it := range batch {
		if it.lead == nil {
			close(it.done)
		}
	}
}

// next ends a call: the items queued meanwhile (up to maxBatch) go to the
// first of their callers to send, or nothing is in flight any more.
func (b *batcher) next() {
	b.mu.Lock()
	var next []*batchItem
	if len(b.queue) > 0 {
		n := min(len(b.queue), maxBatch)
		next = b.queue[:n:n]
		b.queue = b.queue[n:]
		if len(b.queue) == 0 {
			b.queue = nil
		}
	} else {
		b.inFlight = false
	}
	b.mu.Unlock()
	if next != nil {
		next[0].lead = next
		close(next[0].done)
	}
}

// sharedContext is the context of a call made for items: not cancelled by any
// of them, with the latest of their deadlines when every one has a deadline.
func sharedContext(items []*batchItem) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(items[0].ctx)
	var latest time.Time
	for _, it := range items {
		d, ok := it.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}
