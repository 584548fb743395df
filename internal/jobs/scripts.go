package jobs

import (
	"context"
	_ "embed"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/take.lua
	takeLua string
	//go:embed lua/handoff.lua
	handoffLua string
	//go:embed lua/grant.lua
	grantLua string
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/wake.lua
	wakeLua string

	// take and handoff take locks: the lock package's fence rule
	// (nextfence, internal/lock/lua/lib.lua) is prepended to them.
	scriptTake    = redis.NewScript(lock.ScriptLib() + takeLua)
	scriptHandoff = redis.NewScript(lock.ScriptLib() + handoffLua)
	scriptGrant   = redis.NewScript(grantLua)
	scriptClaim   = redis.NewScript(claimLua)
	scriptWake    = redis.NewScript(wakeLua)
)

// run calls a script through the project's one runner (internal/script);
// callers name the operation in their errors.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, c, s, "", keys, args...)
}
