package script_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/script"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

var (
	incr = redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	add  = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)
)

// A pipeline after the server lost its scripts: the calls that met NOSCRIPT
// run once after the reload, and the one that ran is not repeated.
func TestRunPipelinedReloadsOnlyWhatMissed(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	defer c.Close()
	ctx := context.Background()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := incr.Load(ctx, c).Err(); err != nil { // incr is there, add is not
		t.Fatal(err)
	}
	calls := []script.Call{
		{Script: incr, Keys: []string{"a"}},
		{Script: add, Keys: []string{"b"}, Args: []any{5}},
		{Script: add, Keys: []string{"b"}, Args: []any{2}},
	}
	var after *redis.StringCmd
	cmds, err := script.RunPipelined(ctx, c, "test", calls, func(p redis.Pipeliner) { after = p.Get(ctx, "b") })
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{1, 5, 7} {
		if got, err := cmds[i].Int64(); err != nil || got != want {
			t.Errorf("call %d = %d, %v; want %d", i, got, err, want)
		}
	}
	if a := c.Get(ctx, "a").Val(); a != "1" {
		t.Errorf("a = %s, want 1: the call that ran was sent again", a)
	}
	if after.Val() != "7" {
		t.Errorf("after's GET b = %q, want 7 (after runs with the resent calls)", after.Val())
	}
}
