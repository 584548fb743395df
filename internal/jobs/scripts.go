package jobs

import (
	"context"
	_ "embed"

	"github.com/lockstep-dev/lockstep/internal/script"
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

// run calls a script through the project's one runner (internal/script);
// callers name the operation in their errors.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, c, s, "", keys, args...)
}
