package lock

import (
	"context"
	_ "embed"

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

	scriptAcquire    = redis.NewScript(acquireLua)
	scriptRelease    = redis.NewScript(releaseLua)
	scriptRenew      = redis.NewScript(renewLua)
	scriptRenewBatch = redis.NewScript(renewBatchLua)
	scriptFenceRaise = redis.NewScript(fenceRaiseLua)
)

// run is the one way scripts are called: EVALSHA, falling back to EVAL when
// the server does not have the script yet (a restart, a failover). Callers wrap
// the error with the operation's name.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}
