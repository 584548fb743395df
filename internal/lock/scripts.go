package lock

import (
	"context"
	_ "embed"

	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/redis/go-redis/v9"
)

var (
	// lib.lua holds the functions the scripts that take or hand on a lock
	// share (acquire, release, take, handon), and the rate limit's GCRA
	// (rate, take); it is prepended to each, so they run one copy of the code.
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
	//go:embed lua/fair.lua
	fairLua string

	scriptAcquire    = script.New("lock/acquire.lua", libLua+acquireLua)
	scriptRelease    = script.New("lock/release.lua", libLua+releaseLua)
	scriptRenew      = script.New("lock/renew.lua", renewLua)
	scriptRenewBatch = script.New("lock/renew_batch.lua", renewBatchLua)
	scriptFenceRaise = script.New("lock/fence_raise.lua", fenceRaiseLua)
	scriptLeave      = script.New("lock/leave.lua", leaveLua)
	scriptTake       = script.New("lock/take.lua", libLua+takeLua)
	scriptHandOn     = script.New("lock/handon.lua", libLua+handOnLua)
	scriptGrant      = script.New("lock/grant.lua", grantLua)
	scriptClaim      = script.New("lock/claim.lua", claimLua)
	scriptRate       = script.New("lock/rate.lua", libLua+rateLua)
	scriptFront      = script.New("lock/front.lua", libLua+frontLua)
	scriptFair       = script.New("lock/fair.lua", fairLua)
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
