package lock

import (
	"context"
	_ "embed"

	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/redis/go-redis/v9"
)

var (
	// lib.lua holds the functions the scripts that take or hand on a lock
	// share (acquire, release, take, handon); it is prepended to each, so
	// they run one copy of the code.
	//go:embed lua/lib.lua
	libLua string
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
	//go:embed lua/take.lua
	takeLua string
	//go:embed lua/handon.lua
	handOnLua string
	//go:embed lua/grant.lua
	grantLua string
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/rate.lua
	rateLua string
	//go:embed lua/front.lua
	frontLua string
	//go:embed lua/reserve.lua
	reserveLua string

	scriptAcquire    = redis.NewScript(libLua + acquireLua)
	scriptRelease    = redis.NewScript(libLua + releaseLua)
	scriptRenew      = redis.NewScript(renewLua)
	scriptRenewBatch = redis.NewScript(renewBatchLua)
	scriptFenceRaise = redis.NewScript(fenceRaiseLua)
	scriptLeave      = redis.NewScript(leaveLua)
	scriptTake       = redis.NewScript(libLua + takeLua)
	scriptHandOn     = redis.NewScript(libLua + handOnLua)
	scriptGrant      = redis.NewScript(grantLua)
	scriptClaim      = redis.NewScript(claimLua)
	scriptRate       = redis.NewScript(rateLua)
	scriptFront      = redis.NewScript(libLua + frontLua)
	scriptReserve    = redis.NewScript(reserveLua)
)

// run calls one script through the project's one runner (internal/script);
// callers wrap the error with the operation's name.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, c, s, "", keys, args...)
}

// scriptCall is one call of a script in a pipeline.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined sends every call of s in one round trip on c through
// script.RunPipelined (EVALSHA; the calls that meet NOSCRIPT are loaded and
// sent again), then after (if not nil) adds its own commands to the same
// pipeline (e.g. WAIT, which must follow on the same connection). It returns
// one command per call; a failed load is returned as err.
func runPipelined(ctx context.Context, c redis.Cmdable, s *redis.Script, calls []scriptCall, after func(redis.Pipeliner)) ([]*redis.Cmd, error) {
	sc := make([]script.Call, len(calls))
	for i, call := range calls {
		sc[i] = script.Call{Script: s, Keys: call.keys, Args: call.args}
	}
	return script.RunPipelined(ctx, c, "", sc, after)
}
