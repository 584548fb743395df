package jobs

import (
	"context"
	_ "embed"

	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/fence.lua
	fenceLua string
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

	// take and handoff take locks: they share the lock package's fence rule.
	scriptTake    = redis.NewScript(fenceLua + takeLua)
	scriptHandoff = redis.NewScript(fenceLua + handoffLua)
	scriptGrant   = redis.NewScript(grantLua)
	scriptClaim   = redis.NewScript(claimLua)
	scriptWake    = redis.NewScript(wakeLua)
)

// run calls a script through the project's one runner (internal/script);
// callers name the operation in their errors.
func run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) (any, error) {
	return script.Run(ctx, c, s, "", keys, args...)
}
