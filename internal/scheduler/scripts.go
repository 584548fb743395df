package scheduler

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/script"
)

var (
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/done.lua
	doneLua string
	//go:embed lua/skip.lua
	skipLua string

	scriptClaim = redis.NewScript(claimLua)
	scriptDone  = redis.NewScript(doneLua)
	scriptSkip  = redis.NewScript(skipLua)
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
}

// batchItem is one tick in a batched script call: its keys and arguments;
// common holds the leading ARGV, the same for every call of a replica.
type batchItem struct {
	keys   []string
	args   []any
	common []any
}

func newRunner(c redis.UniversalClient) *runner {
	_, cluster := c.(*redis.ClusterClient)
	return &runner{client: c, calls: make(chan *call), cluster: cluster}
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
	more:
		for len(batch) < maxBatch {
			select {
			case c := <-r.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		r.exec(batch)
	}
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
	calls := make([]script.Call, len(live))
	for i, c := range live {
		calls[i] = script.Call{Script: c.script, Keys: c.keys, Args: c.args}
	}
	cmds, err := script.RunPipelined(ctx, r.client, "scheduler scripts", calls, nil)
	for i, c := range live {
		c.res, c.err = cmds[i].Result()
		if err != nil && c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.err = err // its script could not be loaded again
		}
		close(c.done)
	}
}

// merge replaces the batched calls in batch by one call per script and
// slot (per script outside a Cluster) whose reply is split among them.
func (r *runner) merge(batch []*call) []*call {
	type group struct {
		script *redis.Script
		slot   uint16
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
		g := group{script: c.script}
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
