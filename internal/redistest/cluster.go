package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// clusterTimeout bounds how long a new cluster may take to agree on its slots.
const clusterTimeout = 20 * time.Second

// Cluster is a Redis Cluster of masters without replicas, owned by a test.
type Cluster struct {
	tb    testing.TB
	Nodes []*Server // the masters, in the order of redis-cli --cluster create
}

// StartCluster starts masters cluster-enabled servers, joins them with
// redis-cli --cluster create (slots split evenly, no replicas) and returns
// once every node reports cluster_state:ok and knows every other node.
//
// Extra directives are passed to every node, e.g.
// "cluster-require-full-coverage", "no" to keep the other masters serving
// while one is killed. Node timeout is 1s, so a killed master is marked
// failed quickly.
func StartCluster(tb testing.TB, masters int, directives ...string) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli := proctest.Binary(tb, "redis-cli", "redis-server") // redis-cli comes with it
	c := &Cluster{tb: tb}
	args := []string{"--cluster", "create"}
	for range masters {
		s := Start(tb, append([]string{
			"cluster-enabled", "yes",
			"cluster-node-timeout", "1000",
		}, directives...)...)
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out[max(len(out)-2000, 0):])
	}
	c.waitHealthy(ctx)
	return c
}

// waitHealthy waits until every running node says cluster_state:ok and
// knows all nodes.
func (c *Cluster) waitHealthy(ctx context.Context) {
	c.tb.Helper()
	for _, s := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		var last string
		for {
			info, err := client.ClusterInfo(ctx).Result()
			last = fmt.Sprint(info, err)
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))+"\r") {
				break
			}
			select {
			case <-ctx.Done():
				_ = client.Close()
				c.tb.Fatalf("redistest: cluster node %s not ready within %v: %s", s.Addr, clusterTimeout, last)
			case <-time.After(20 * time.Millisecond):
			}
		}
		_ = client.Close()
	}
}

// Addrs returns the addresses of all nodes.
func (c *Cluster) Addrs() []string { return addrsOf(c.Nodes) }

// Client returns a new cluster client seeded with every node, closed when the
// test ends.
func (c *Cluster) Client(opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	return client(c.tb, &redis.ClusterOptions{Addrs: c.Addrs()}, opts, redis.NewClusterClient)
}

// NodeFor returns the master that serves key's hash slot.
func (c *Cluster) NodeFor(key string) *Server {
	c.tb.Helper()
	ctx := context.Background()
	for _, s := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		slot, err := client.ClusterKeySlot(ctx, key).Result()
		var slots []redis.ClusterSlot
		if err == nil {
			slots, err = client.ClusterSlots(ctx).Result()
		}
		_ = client.Close()
		if err != nil {
			continue // a killed node: ask the next
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				for _, n := range c.Nodes {
					if n.Addr == r.Nodes[0].Addr {
						return n
					}
				}
			}
		}
	}
	c.tb.Fatalf("redistest: no cluster node serves %q", key)
	return nil
}
