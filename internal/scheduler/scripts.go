package scheduler

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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

// maxBatch bounds the script calls sent in one pipeline.
const maxBatch = 256

// runner is the one way scripts are called. Calls that arrive while a
// pipeline is in flight go out together in the next one (natural batching,
// no added wait), so the claims of all schedules due in the same second cost
// one round trip instead of one each. A pipeline sends EVALSHA only; a call
// that meets NOSCRIPT (Redis restarted, a failover) is retried alone with
// EVALSHA-then-EVAL, which loads the script again.
type runner struct {
	client redis.UniversalClient
	calls  chan *call
}

type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{}
}

func newRunner(c redis.UniversalClient) *runner {
	return &runner{client: c, calls: make(chan *call)}
}

// run calls script and names the operation and the schedule in its error.
func (r *runner) run(ctx context.Context, op, schedule string, s *redis.Script, keys []string, args ...any) (any, error) {
	c := &call{ctx: ctx, script: s, keys: keys, args: args, done: make(chan struct{})}
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
	switch len(live) {
	case 0:
		return
	case 1:
		c := live[0]
		c.res, c.err = c.script.Run(c.ctx, r.client, c.keys, c.args...).Result()
		close(c.done)
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	cmds := make([]*redis.Cmd, len(live))
	_, _ = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range live {
			cmds[i] = c.script.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	for i, c := range live {
		c.res, c.err = cmds[i].Result()
		if c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.res, c.err = c.script.Run(c.ctx, r.client, c.keys, c.args...).Result()
		}
		close(c.done)
	}
}
