package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// A server from StartAOF keeps every acknowledged write across SIGKILL and
// Restart (appendfsync always), including the TTL of a key.
func TestAOFSurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartAOF(t)
	c := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	for i := range 100 {
		if err := c.Set(ctx, fmt.Sprintf("k%d", i), i, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s.Kill()
	s.Restart()
	for i := range 100 {
		if got, err := c.Get(ctx, fmt.Sprintf("k%d", i)).Int(); err != nil || got != i {
			t.Fatalf("after kill and restart: k%d = %d, %v; want %d", i, got, err, i)
		}
	}
	if ttl, err := c.PTTL(ctx, "k0").Result(); err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("after kill and restart: PTTL k0 = %v, %v", ttl, err)
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

func TestClusterServesEverySlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartCluster(t, 3)
	client := c.Client()
	seen := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("{k%d}", i)
		if err := client.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		seen[c.NodeFor(key).Addr] = true
	}
	if len(seen) != 3 {
		t.Fatalf("30 keys landed on %d masters, want all 3", len(seen))
	}
	// NodeFor names the master that holds the key.
	direct := c.NodeFor("{k7}").Client()
	if got, err := direct.Get(ctx, "{k7}").Int(); err != nil || got != 7 {
		t.Fatalf("GET on NodeFor's master: %v, %v", got, err)
	}
}

// A killed master's replica is promoted by the cluster itself; a key
// written before the kill (and replicated: WAIT) is served by it. It logs
// the promotion's delay and when another master first answered CLUSTERDOWN
// (Redis's default cluster-require-full-coverage).
func TestClusterWithReplicasPromotesOnKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartClusterWithReplicas(t, 3)
	m, r := c.Nodes[0], c.Replicas[0]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("{k%d}", i); c.NodeFor(k) == m {
			key = k
		}
	}
	if err := m.Client().Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Client().Wait(ctx, 1, 2*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	other := c.Nodes[1].Client()
	m.Kill()
	killed := time.Now()
	var down time.Duration
	WaitFor(t, 20*time.Second, "the replica promoted", func() bool {
		if err := other.Ping(ctx).Err(); err == nil {
			if err := other.Get(ctx, "{any}").Err(); down == 0 && err != nil && strings.HasPrefix(err.Error(), "CLUSTERDOWN") {
				down = time.Since(killed)
			}
		}
		info, err := r.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	})
	promoted := time.Since(killed)
	if got, err := r.Client().Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("GET %s on the promoted replica: %q, %v", key, got, err)
	}
	t.Logf("replica promoted %v after its master was killed; another master answered CLUSTERDOWN from %v (0: never)",
		promoted.Round(time.Millisecond), down.Round(time.Millisecond))
	if masters, _, _ := c.Roles(time.Second); !slices.Contains(masters, r) || slices.Contains(masters, m) {
		t.Fatalf("masters after the kill: %v", addrsOf(masters))
	}
	if ok, why := c.Healthy(time.Second); ok {
		t.Fatal("Healthy with a master killed")
	} else {
		t.Logf("not healthy with a master killed: %s", why)
	}
	// Restarted (empty), the killed master rejoins as its old replica's
	// replica, and the cluster is whole again.
	m.Restart()
	WaitFor(t, 30*time.Second, "the cluster whole again", func() bool { ok, _ := c.Healthy(time.Second); return ok })
	if _, replicaOf, linked := c.Roles(time.Second); replicaOf[m] != r || !linked[m] {
		t.Fatalf("the restarted master replicates %v (linked %t), want %s", replicaOf[m], linked[m], r.Addr)
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartSentinel(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 2*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	start := time.Now()
	from, to := s.Failover()
	t.Logf("failover %s -> %s took %v", from.Addr, to.Addr, time.Since(start))
	if s.Master() != to || from == to {
		t.Fatalf("master is %s after failover from %s", s.Master().Addr, from.Addr)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET through the failover client after failover: %q, %v", got, err)
	}
	if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatalf("SET on the new master: %v", err)
	}
	s.WaitReplicaLinked(from)

	// A cut link: writes stay on the master until it is healed.
	s.CutReplication(to)
	if err := c.Set(ctx, "only-on-master", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 300*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 with replication cut = %d, %v; want 0", n, err)
	}
	s.HealReplication(to)
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after heal = %d, %v; want 1", n, err)
	}
}
