// Package script is the one way Lockstep runs its Lua scripts.
//
// Scripts are embedded .lua files, each with a header listing KEYS, ARGV and
// return values, wrapped once in redis.NewScript. Run sends EVALSHA and falls
// back to EVAL when the server does not have the script (a restart, a
// failover), and names the operation in its errors.
package script

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Run runs s on c and returns its reply. Errors name op, e.g. "demo begin".
func Run(ctx context.Context, c redis.Scripter, s *redis.Script, op string, keys []string, args ...any) (any, error) {
	v, err := s.Run(ctx, c, keys, args...).Result()
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return v, err
}
