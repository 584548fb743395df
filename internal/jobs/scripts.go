package jobs

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/contended.lua
	contendedLua string
	//go:embed lua/next_waiter.lua
	nextWaiterLua string
	//go:embed lua/wake.lua
	wakeLua string

	scriptContended  = redis.NewScript(contendedLua)
	scriptNextWaiter = redis.NewScript(nextWaiterLua)
	scriptWake       = redis.NewScript(wakeLua)
)

// run is the one way this package calls a script: EVALSHA, falling back to
// EVAL when the server does not have it yet. Callers name the operation in
// their errors.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c, keys, args...).Result()
}
