package redistest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Start(t)
	c := s.Client(func(o *redis.Options) { o.MaxRetries = -1; o.ReadTimeout = 200 * time.Millisecond })
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	if err := c.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET answered while the server was paused")
	}
	s.Resume()
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("after resume: GET = %q, %v; want v", got, err)
	}

	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after kill")
	}
	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("restarted server kept data: %v", err)
	}
}

func TestStartNIndependent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	servers := StartN(t, 3)
	seen := map[string]bool{}
	for i, s := range servers {
		if seen[s.Addr] {
			t.Fatalf("server %d shares address %s", i, s.Addr)
		}
		seen[s.Addr] = true
		if err := s.Client().Set(ctx, "only-here", i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range servers {
		if got, _ := s.Client().Get(ctx, "only-here").Int(); got != i {
			t.Fatalf("server %d has %d, want its own value", i, got)
		}
	}
}

func TestReplicaFollowsMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, r := StartWithReplica(t)
	if err := m.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := m.Client().Wait(ctx, 1, 2*time.Second).Result()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want 1 acknowledgement", n, err)
	}
	if got, err := r.Client().Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("replica GET = %q, %v", got, err)
	}
}
