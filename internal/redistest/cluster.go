package redistest

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/script"
)

// clusterTimeout bounds how long a new cluster may take to agree on its slots.
const clusterTimeout = 20 * time.Second

// Cluster is a Redis Cluster of masters, with or without replicas, owned
// by a test.
type Cluster struct {
	tb       testing.TB
	Nodes    []*Server // the masters, in the order of redis-cli --cluster create
	Replicas []*Server // Replicas[i] replicates Nodes[i] (StartClusterWithReplicas)
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
	return startCluster(tb, masters, false, directives)
}

// StartClusterWithReplicas is StartCluster with one replica per master,
// returned once each replica has synced: a killed master's replica is
// promoted by the cluster itself within a few node timeouts.
func StartClusterWithReplicas(tb testing.TB, masters int, directives ...string) *Cluster {
	tb.Helper()
	return startCluster(tb, masters, true, directives)
}

func startCluster(tb testing.TB, masters int, replicas bool, directives []string) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli := proctest.Binary(tb, "redis-cli", "redis-server") // redis-cli comes with it
	c := &Cluster{tb: tb}
	start := func() *Server {
		return Start(tb, append([]string{
			"cluster-enabled", "yes",
			"cluster-node-timeout", "1000",
		}, directives...)...)
	}
	args := []string{"--cluster", "create"}
	for range masters {
		s := start()
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	create := func(args ...string) {
		if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
			tb.Fatalf("redistest: redis-cli %v: %v\n%s", args[:2], err, out[max(len(out)-2000, 0):])
		}
	}
	create(append(args, "--cluster-replicas", "0", "--cluster-yes")...)
	if replicas {
		for _, m := range c.Nodes {
			r := start()
			c.Replicas = append(c.Replicas, r)
			create("--cluster", "add-node", r.Addr, m.Addr, "--cluster-slave", "--cluster-master-id", nodeID(tb, ctx, m))
		}
	}
	c.waitHealthy(ctx)
	return c
}

// nodeID is the cluster node id of s.
func nodeID(tb testing.TB, ctx context.Context, s *Server) string {
	tb.Helper()
	client := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer client.Close()
	id, err := client.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		tb.Fatalf("redistest: CLUSTER MYID of %s: %v", s.Addr, err)
	}
	return id
}

// waitHealthy waits until every running node says cluster_state:ok and
// knows all nodes, and every replica's link to its master is up.
func (c *Cluster) waitHealthy(ctx context.Context) {
	c.tb.Helper()
	all := append(slices.Clone(c.Nodes), c.Replicas...)
	for _, s := range all {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		var last string
		for {
			info, err := client.ClusterInfo(ctx).Result()
			last = fmt.Sprint(info, err)
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(all))+"\r") {
				if !slices.Contains(c.Replicas, s) {
					break
				}
				repl, err := client.Info(ctx, "replication").Result()
				last = fmt.Sprint(repl, err)
				if err == nil && strings.Contains(repl, "master_link_status:up") {
					break
				}
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

// Errors returns the error replies of every running node (replicas too)
// since it started, summed by their first word (INFO errorstats:
// "CROSSSLOT", "NOSCRIPT", "ERR", ...): a Cluster test that checks
// "CROSSSLOT" finds a command or script whose keys span slots, whoever sent
// it.
func (c *Cluster) Errors() map[string]int {
	c.tb.Helper()
	out := map[string]int{}
	for _, s := range append(slices.Clone(c.Nodes), c.Replicas...) {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		info, err := client.Info(context.Background(), "errorstats").Result()
		_ = client.Close()
		if err != nil {
			continue // a killed node
		}
		for _, line := range strings.Split(info, "\r\n") {
			name, count, ok := strings.Cut(strings.TrimPrefix(line, "errorstat_"), ":count=")
			if n, err := strconv.Atoi(count); ok && err == nil && strings.HasPrefix(line, "errorstat_") {
				out[name] += n
			}
		}
	}
	return out
}

// HasScript reports whether a running node has the script with SHA-1 hash
// in its cache: whether it was run (or loaded, to be run) on the cluster.
func (c *Cluster) HasScript(hash string) bool {
	c.tb.Helper()
	for _, s := range append(slices.Clone(c.Nodes), c.Replicas...) {
		client := redis.NewClient(&redis.Options{Addr: s.Addr})
		ok, err := client.ScriptExists(context.Background(), hash).Result()
		_ = client.Close()
		if err == nil && ok[0] {
			return true
		}
	}
	return false
}

// Scripts splits the scripts of the program (script.All: those of the
// packages it links) into those that ran on the cluster (HasScript) and
// those that did not, each sorted by name.
func (c *Cluster) Scripts() (ran, not []string) {
	c.tb.Helper()
	for _, name := range slices.Sorted(maps.Keys(script.All())) {
		if c.HasScript(script.All()[name].Hash()) {
			ran = append(ran, name)
		} else {
			not = append(not, name)
		}
	}
	return ran, not
}

// Servers returns every node of the cluster, masters and replicas as
// started (failovers swap their roles: Roles says what they are now).
func (c *Cluster) Servers() []*Server { return append(slices.Clone(c.Nodes), c.Replicas...) }

// Roles returns the nodes that say they are masters now (INFO replication),
// sorted by port, and each replica's master with whether its link to it is
// up. A node that does not answer within timeout (killed, paused) is in
// neither.
func (c *Cluster) Roles(timeout time.Duration) (masters []*Server, replicaOf map[*Server]*Server, linked map[*Server]bool) {
	replicaOf, linked = map[*Server]*Server{}, map[*Server]bool{}
	byPort := map[string]*Server{}
	for _, s := range c.Servers() {
		byPort[strconv.Itoa(s.Port)] = s
	}
	for _, s := range c.Servers() {
		info, err := s.info(timeout, "replication")
		switch {
		case err != nil:
		case strings.Contains(info, "role:master\r\n"):
			masters = append(masters, s)
		default:
			if m := byPort[infoField(info, "master_port")]; m != nil {
				replicaOf[s], linked[s] = m, infoField(info, "master_link_status") == "up"
			}
		}
	}
	slices.SortFunc(masters, func(a, b *Server) int { return a.Port - b.Port })
	return masters, replicaOf, linked
}

// Healthy reports whether the cluster is whole again, and if not, what is
// missing: every node answers and says cluster_state:ok, as many nodes say
// they are masters as were started, and every other node is a replica
// linked to one of them, each master having one.
func (c *Cluster) Healthy(timeout time.Duration) (bool, string) {
	for _, s := range c.Servers() {
		info, err := s.info(timeout, "cluster")
		if err != nil {
			return false, fmt.Sprintf("%s: %v", s.Addr, err)
		}
		if infoField(info, "cluster_enabled") != "1" {
			return false, s.Addr + ": not a cluster node"
		}
		client := s.probe(timeout)
		ci, err := client.ClusterInfo(context.Background()).Result()
		_ = client.Close()
		if err != nil || !strings.Contains(ci, "cluster_state:ok") {
			return false, fmt.Sprintf("%s: cluster_state not ok (%v)", s.Addr, err)
		}
	}
	masters, replicaOf, linked := c.Roles(timeout)
	if len(masters) != len(c.Nodes) {
		return false, fmt.Sprintf("%d masters, want %d", len(masters), len(c.Nodes))
	}
	served := map[*Server]int{}
	for r, m := range replicaOf {
		if !linked[r] {
			return false, r.Addr + ": replica not linked to its master " + m.Addr
		}
		served[m]++
	}
	for _, m := range masters {
		if len(c.Replicas) > 0 && served[m] != len(c.Replicas)/len(c.Nodes) {
			return false, fmt.Sprintf("master %s has %d replicas", m.Addr, served[m])
		}
	}
	return true, ""
}

// info returns s's INFO section within timeout.
func (s *Server) info(timeout time.Duration, section string) (string, error) {
	client := s.probe(timeout)
	defer client.Close()
	return client.Info(context.Background(), section).Result()
}

// probe returns a client of s for one look, each call bounded by timeout
// and tried once; the caller closes it.
func (s *Server) probe(timeout time.Duration) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.tls,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: -1})
}

// infoField returns the value of field in INFO text.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}
