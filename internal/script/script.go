// Package script is the one way Lockstep runs its Lua scripts.
//
// Scripts are embedded .lua files, each with a header listing KEYS, ARGV and
// return values, wrapped once by New, which registers it (All). Run sends
// EVALSHA and falls back to EVAL when the server does not have the script (a
// restart, a failover), and names the operation in its errors.
package script

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/redis/go-redis/v9"
)

var (
	mu  sync.Mutex
	all = map[string]*redis.Script{}
)

// New wraps src, an embedded script, once, named by its package and its
// file with a slash between (internal/lock/lua/acquire.lua: "lock"+"/acquire.lua"),
// and registers it, so that a test can reach every script of the program
// (All): the Cluster test runs each one.
func New(name, src string) *redis.Script {
	s := redis.NewScript(src)
	mu.Lock()
	defer mu.Unlock()
	if _, dup := all[name]; dup {
		panic("script: two scripts named " + name)
	}
	all[name] = s
	return s
}

// All returns every script made with New in this program, by name.
func All() map[string]*redis.Script {
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(all)
}

// Run runs s on c and returns its reply. Errors name op, e.g. "demo begin"
// (op "" leaves the naming to a caller that wraps every error itself).
func Run(ctx context.Context, c redis.Scripter, s *redis.Script, op string, keys []string, args ...any) (any, error) {
	v, err := s.Run(ctx, c, keys, args...).Result()
	if err != nil && err != redis.Nil && op != "" {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return v, err
}

// Call is one script call in a pipeline.
type Call struct {
	Script *redis.Script
	Keys   []string
	Args   []any
}

// RunPipelined sends every call as EVALSHA in one pipeline on c, then after
// (if not nil) adds its own commands to the same pipeline (e.g. WAIT). A
// pipeline can only send EVALSHA, so the calls that meet NOSCRIPT (the server
// restarted or failed over) have their scripts loaded and are sent again, in
// one more pipeline (with after again); the calls that ran are not repeated.
// It returns one command per call; a failed load is err, naming op.
func RunPipelined(ctx context.Context, c redis.Cmdable, op string, calls []Call, after func(redis.Pipeliner)) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 0 {
		return cmds, nil
	}
	send := func(idx []int) {
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				cmds[i] = calls[i].Script.EvalSha(ctx, p, calls[i].Keys, calls[i].Args...)
			}
			if after != nil {
				after(p)
			}
			return nil
		})
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all)
	var again []int
	loaded := map[*redis.Script]bool{}
	for i, cmd := range cmds {
		if err := cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			continue
		}
		again = append(again, i)
		if s := calls[i].Script; !loaded[s] {
			if err := s.Load(ctx, c).Err(); err != nil {
				return cmds, fmt.Errorf("%s: load script: %w", op, err)
			}
			loaded[s] = true
		}
	}
	if len(again) > 0 {
		send(again)
	}
	return cmds, nil
}
