package lock

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/renew_batch.lua
	renewBatchLua string
	//go:embed lua/fence_raise.lua
	fenceRaiseLua string
	//go:embed lua/leave.lua
	leaveLua string

	scriptAcquire    = redis.NewScript(acquireLua)
	scriptRelease    = redis.NewScript(releaseLua)
	scriptRenew      = redis.NewScript(renewLua)
	scriptRenewBatch = redis.NewScript(renewBatchLua)
	scriptFenceRaise = redis.NewScript(fenceRaiseLua)
	scriptLeave      = redis.NewScript(leaveLua)
)

// run is the one way a script is called alone: EVALSHA, falling back to EVAL
// when the server does not have the script yet (a restart, a failover).
// Callers wrap the error with the operation's name.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}

// scriptCall is one call of a script in a pipeline.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined is the one way scripts are called in a pipeline: every call of
// s in one round trip on c, then after (if not nil) adds its own commands to
// the same pipeline (e.g. WAIT, which must follow on the same connection). A
// pipeline can only send EVALSHA, so when the server answers NOSCRIPT (it
// restarted or failed over) the script is loaded and the pipeline sent again,
// once. It returns one command per call; a failed load is returned as err.
func runPipelined(ctx context.Context, c redis.Cmdable, s *redis.Script, calls []scriptCall, after func(redis.Pipeliner)) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(calls))
	send := func() {
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				cmds[i] = s.EvalSha(ctx, p, call.keys, call.args...)
			}
			if after != nil {
				after(p)
			}
			return nil
		})
	}
	if len(calls) == 0 {
		return cmds, nil
	}
	send()
	if err := cmds[0].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := s.Load(ctx, c).Err(); err != nil {
			return nil, fmt.Errorf("load script: %w", err)
		}
		send()
	}
	return cmds, nil
}
