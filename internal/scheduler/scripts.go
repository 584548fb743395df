package scheduler

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/script"
)

// The scheduler's scripts, each in lua/ with its header (KEYS, ARGV,
// returns): the tick's claim and its end, the live-replica set, the
// run-time schedules' store, and a backfilled tick's record and count. lib.lua is no script of its own: it is
// prepended to the two that prune the file-schedule registry.
var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/done.lua
	doneLua string
	//go:embed lua/skip.lua
	skipLua string
	//go:embed lua/replicas.lua
	replicasLua string
	//go:embed lua/register.lua
	registerLua string
	//go:embed lua/put.lua
	putLua string
	//go:embed lua/remove.lua
	removeLua string
	//go:embed lua/pause.lua
	pauseLua string
	//go:embed lua/backfilled.lua
	backfilledLua string

	scriptClaim    = script.New("scheduler/claim.lua", claimLua)
	scriptDone     = script.New("scheduler/done.lua", doneLua)
	scriptSkip     = script.New("scheduler/skip.lua", skipLua)
	scriptReplicas = script.New("scheduler/replicas.lua", libLua+replicasLua)
	scriptRegister = script.New("scheduler/register.lua", libLua+registerLua)
	scriptPut      = script.New("scheduler/put.lua", putLua)
	scriptRemove   = script.New("scheduler/remove.lua", removeLua)
	scriptPause    = script.New("scheduler/pause.lua", pauseLua)
	// scriptBackfilled is the Store's, not the replicas': a backfill's
	// record and count of a tick it enqueued.
	scriptBackfilled = script.New("scheduler/backfilled.lua", backfilledLua)
)

// maxBatch bounds the script calls sent in one pipeline (and the ticks one
// batched claim takes).
const maxBatch = 4096

// runner batches the scheduler's script calls. Calls that arrive while a
// pipeline is in flight go out together in the next one (natural batching,
// no added wait), so the claims of all schedules due in the same second cost
// one round trip instead of one each. Every pipeline, also of one call, goes
// through script.RunPipelined: EVALSHA only, and the calls that meet
// NOSCRIPT (Redis restarted, a failover) are sent again once their scripts
// are loaded.
type runner struct {
	client  redis.UniversalClient
	calls   chan *call
	cluster bool // batch claims per hash slot, not per node
}

type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{}
	// item is set for one tick of a batched script (claim.lua, done.lua):
	// the runner merges the calls of one script that are due together into
	// one call per slot.
	item *batchItem
	// raw is set for a command built elsewhere (an asynq enqueue, through
	// enqueueClient): it goes out in the same pipeline, once, and its reply
	// is in the command itself.
	raw *redis.Cmd
}

// batchItem is one tick in a batched script call: its keys and arguments;
// common holds the leading ARGV, the same for every tick merged into one
// call (the replica's settings, the tick's second): items whose common
// differ go in different calls.
type batchItem struct {
	keys   []string
	args   []any
	common []any
	// lead are keys the merged call declares once, before every item's
	// keys: the same for all items of one group (they follow from common).
	lead []string
}

func newRunner(c redis.UniversalClient) *runner {
	_, cluster := c.(*redis.ClusterClient)
	return &runner{client: c, calls: make(chan *call, maxBatch), cluster: cluster}
}

// run calls script and names the operation and the schedule in its error.
func (r *runner) run(ctx context.Context, op, schedule string, s *redis.Script, keys []string, args ...any) (any, error) {
	return r.send(ctx, op, schedule, &call{ctx: ctx, script: s, keys: keys, args: args, done: make(chan struct{})})
}

// runBatched runs one tick of a batched script; its reply is the script's
// reply for that tick.
func (r *runner) runBatched(ctx context.Context, op, schedule string, s *redis.Script, it *batchItem) (any, error) {
	return r.send(ctx, op, schedule, &call{ctx: ctx, script: s, item: it, done: make(chan struct{})})
}

func (r *runner) send(ctx context.Context, op, schedule string, c *call) (any, error) {
	select {
	case r.calls <- c:
	case <-ctx.Done():
		return nil, fmt.Errorf("scheduler: %s %s: %w", op, schedule, context.Cause(ctx))
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("scheduler: %s %s: %w", op, schedule, context.Cause(ctx))
	}
	if c.err != nil {
		return nil, fmt.Errorf("scheduler: %s %s: %w", op, schedule, c.err)
	}
	return c.res, nil
}

// loop executes calls until stop is closed.
func (r *runner) loop(stop <-chan struct{}) {
	for {
		var batch []*call
		select {
		case c := <-r.calls:
			batch = append(batch, c)
		case <-stop:
			return
		}
		batch = r.gather(batch, stop)
		r.exec(batch)
	}
}

// Ticks due in the same second wake thousands of goroutines that reach the
// runner over some milliseconds, not at one instant. Woken by a call while
// idle, the runner waits linger before it takes what has come, so that they
// share one pipeline (and one merged claim); calls that come while a
// pipeline is in flight wait in the channel's buffer for the next one.
const linger = time.Millisecond

// gather adds to batch the calls that have come within linger.
func (r *runner) gather(batch []*call, stop <-chan struct{}) []*call {
	t := time.NewTimer(linger)
	select {
	case <-t.C:
	case <-stop:
		t.Stop()
	}
	for len(batch) < maxBatch {
		select {
		case c := <-r.calls:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

func (r *runner) exec(batch []*call) {
	batch = r.merge(batch)
	live := batch[:0]
	var deadline time.Time
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil { // its caller is gone (a stop, a crash): do not send it
			c.err = err
			close(c.done)
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := live[0].ctx // one call: its own context
	if len(live) > 1 {
		ctx = context.Background()
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
	var scripted, raw []*call
	for _, c := range live {
		if c.raw != nil {
			raw = append(raw, c)
		} else {
			scripted = append(scripted, c)
		}
	}
	calls := make([]script.Call, len(scripted))
	for i, c := range scripted {
		calls[i] = script.Call{Script: c.script, Keys: c.keys, Args: c.args}
	}
	var after func(redis.Pipeliner)
	if len(raw) > 0 {
		// Sent with the first pipeline only: RunPipelined sends after again
		// with the calls that met NOSCRIPT, and a raw command's own
		// NOSCRIPT is its caller's to handle (redis.Script.Run falls back
		// to EVAL).
		sent := false
		after = func(p redis.Pipeliner) {
			if sent {
				return
			}
			sent = true
			for _, c := range raw {
				_ = p.Process(ctx, c.raw)
			}
		}
	}
	var cmds []*redis.Cmd
	var err error
	if len(scripted) > 0 {
		cmds, err = script.RunPipelined(ctx, r.client, "scheduler scripts", calls, after)
	} else {
		_, _ = r.client.Pipelined(ctx, func(p redis.Pipeliner) error { after(p); return nil })
	}
	for i, c := range scripted {
		c.res, c.err = cmds[i].Result()
		if err != nil && c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.err = err // its script could not be loaded again
		}
		close(c.done)
	}
	for _, c := range raw {
		close(c.done)
	}
}

// enqueueClient is the Redis client of the replica's asynq client: its
// enqueues go through the runner (asynqstore.PipelineEnqueues), so that the
// enqueues of the ticks due together share pipelines with each other and
// with the claims and dones, instead of one round trip each on a pool of 20
// connections.
func (r *runner) enqueueClient() redis.UniversalClient {
	return asynqstore.PipelineEnqueues(r.client, r.sendRaw)
}

// sendRaw sends cmd, built elsewhere, once in the next pipeline; its reply
// is in cmd when sendRaw returns nil.
func (r *runner) sendRaw(ctx context.Context, cmd *redis.Cmd) error {
	c := &call{ctx: ctx, raw: cmd, done: make(chan struct{})}
	select {
	case r.calls <- c:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return context.Cause(ctx) // cmd may still be in flight
	}
}

// merge replaces the batched calls in batch by one call per script, common
// arguments and slot (outside a Cluster: per script and common arguments)
// whose reply is split among them.
func (r *runner) merge(batch []*call) []*call {
	type group struct {
		script *redis.Script
		slot   uint16
		common string
	}
	groups := map[group][]*call{}
	var order []group
	out := batch[:0:0]
	for _, c := range batch {
		if c.item == nil {
			out = append(out, c)
			continue
		}
		if c.ctx.Err() != nil {
			c.err = c.ctx.Err()
			close(c.done)
			continue
		}
		g := group{script: c.script, common: fmt.Sprint(c.item.lead, c.item.common)}
		if r.cluster {
			g.slot = slot(c.item.keys[0])
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], c)
	}
	for _, g := range order {
		members := groups[g]
		m := &call{ctx: members[0].ctx, script: g.script, done: make(chan struct{})}
		m.keys = append(m.keys, members[0].item.lead...)
		m.args = append(m.args, members[0].item.common...)
		var deadline time.Time
		for _, c := range members {
			m.keys = append(m.keys, c.item.keys...)
			m.args = append(m.args, c.item.args...)
			if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
				deadline = d
			}
		}
		// The merged call lives as long as its longest-lived member; a
		// member whose caller left meanwhile simply gets no answer.
		m.ctx = context.WithoutCancel(m.ctx)
		cancel := func() {}
		if !deadline.IsZero() {
			m.ctx, cancel = context.WithDeadline(m.ctx, deadline)
		}
		go split(m, members, cancel)
		out = append(out, m)
	}
	return out
}

// split hands each member its element of the merged claim's reply.
func split(m *call, members []*call, cancel context.CancelFunc) {
	<-m.done
	cancel()
	replies, _ := m.res.([]any)
	for i, c := range members {
		switch {
		case m.err != nil:
			c.err = m.err
		case i < len(replies):
			c.res = replies[i]
		default:
			c.err = fmt.Errorf("batched reply has %d elements, want %d", len(replies), len(members))
		}
		close(c.done)
	}
}
