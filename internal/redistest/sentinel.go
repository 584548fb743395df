package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// failoverTimeout bounds how long Failover waits for the sentinels to agree
// on a new master and for the old one to follow it.
const failoverTimeout = 20 * time.Second

// Replication runs as its own ACL user on both data nodes, so that a test can
// cut the replication link (CutReplication) without touching clients.
const (
	replUser     = "repl"
	replPassword = "repl-secret"
)

// Sentinel is a Sentinel-managed master with one replica and three sentinels,
// owned by a test. The two data nodes swap roles on every failover: ask
// Master and Replica for the current ones.
type Sentinel struct {
	tb         testing.TB
	MasterName string
	Data       [2]*Server // the data nodes; Data[0] starts as the master
	Sentinels  []*Server
}

// StartSentinel starts a master, a replica of it and three sentinels that
// monitor the master (quorum 2, down-after 1s), and returns once the replica
// is linked up and every sentinel knows the replica and the other sentinels.
// Extra directives go to both data nodes.
func StartSentinel(tb testing.TB, directives ...string) *Sentinel {
	tb.Helper()
	s := &Sentinel{tb: tb, MasterName: "lockstep"}
	data := func(extra ...string) *Server {
		return launch(tb, nil, func(port int, dir string) []string {
			args := append(serverArgs(port, dir),
				"--user", replUser, "on", ">"+replPassword, "~*", "&*", "+@all",
				"--masteruser", replUser,
				"--masterauth", replPassword,
			)
			return append(append(args, extra...), expand(directives)...)
		})
	}
	s.Data[0] = data()
	s.Data[1] = data("--replicaof", "127.0.0.1", strconv.Itoa(s.Data[0].Port))
	for range 3 {
		s.Sentinels = append(s.Sentinels, launch(tb, nil, func(port int, dir string) []string {
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %[4]s 1000\n"+
				"sentinel failover-timeout %[4]s 5000\n"+
				"sentinel parallel-syncs %[4]s 1\n",
				port, dir, logFile(dir, port), s.MasterName, s.Data[0].Port)
			return []string{proctest.WriteFile(tb, fmt.Sprintf("sentinel-%d.conf", port), text), "--sentinel"}
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), failoverTimeout)
	defer cancel()
	s.waitLinked(ctx, s.Data[1])
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
		s.waitFor(ctx, "sentinel "+sn.Addr+" to discover the replica and the other sentinels", func() bool {
			m, err := c.Master(ctx, s.MasterName).Result()
			return err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2"
		})
		_ = c.Close()
	}
	return s
}

// SentinelAddrs returns the addresses of the three sentinels.
func (s *Sentinel) SentinelAddrs() []string { return addrsOf(s.Sentinels) }

// Client returns a new go-redis failover client (the master as the sentinels
// name it), closed when the test ends.
func (s *Sentinel) Client(opts ...func(*redis.FailoverOptions)) *redis.Client {
	return client(s.tb, &redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs()}, opts, redis.NewFailoverClient)
}

// Master returns the data node the first answering sentinel names as master.
func (s *Sentinel) Master() *Server {
	s.tb.Helper()
	addr, err := s.masterAddr(context.Background())
	if err != nil {
		s.tb.Fatalf("redistest: ask sentinels for the master: %v", err)
	}
	return s.node(addr)
}

// Replica returns the data node that is not the master.
func (s *Sentinel) Replica() *Server {
	s.tb.Helper()
	if m := s.Master(); m == s.Data[0] {
		return s.Data[1]
	}
	return s.Data[0]
}

func (s *Sentinel) masterAddr(ctx context.Context) (string, error) {
	var lastErr error
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, DialTimeout: 200 * time.Millisecond})
		hp, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		lastErr = err
	}
	return "", lastErr
}

func (s *Sentinel) node(addr string) *Server {
	for _, d := range s.Data {
		if d.Addr == addr {
			return d
		}
	}
	s.tb.Fatalf("redistest: sentinels name %s as master, which is not a data node", addr)
	return nil
}

// Failover makes the sentinels fail the master over to the replica
// (SENTINEL FAILOVER, which needs no agreement that the master is down) and
// returns once every sentinel names the new master and it reports
// role:master. Then the old master, if it answers, is pointed at the new one
// (REPLICAOF) and Failover waits for its link: the sentinels would do the
// same on their next INFO poll of it, up to 10s later. Following the new
// master discards the old master's data.
func (s *Sentinel) Failover() (from, to *Server) {
	s.tb.Helper()
	from, to = s.Master(), s.Replica()
	ctx, cancel := context.WithTimeout(context.Background(), failoverTimeout)
	defer cancel()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr})
	defer c.Close()
	s.waitFor(ctx, "SENTINEL FAILOVER to be accepted", func() bool {
		// INPROG while the previous failover's bookkeeping ends; retry.
		return c.Failover(ctx, s.MasterName).Err() == nil
	})
	s.WaitMaster(ctx, to)
	old := redis.NewClient(&redis.Options{Addr: from.Addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer old.Close()
	if old.Ping(ctx).Err() == nil {
		if err := old.SlaveOf(ctx, "127.0.0.1", strconv.Itoa(to.Port)).Err(); err != nil {
			s.tb.Fatalf("redistest: point the old master %s at %s: %v", from.Addr, to.Addr, err)
		}
		s.waitLinked(ctx, from)
	}
	return from, to
}

// WaitMaster waits until every sentinel names m as master and m reports
// role:master.
func (s *Sentinel) WaitMaster(ctx context.Context, m *Server) {
	s.tb.Helper()
	hp := []string{"127.0.0.1", strconv.Itoa(m.Port)}
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr})
		s.waitFor(ctx, "sentinel "+sn.Addr+" to name "+m.Addr+" master", func() bool {
			got, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
			return err == nil && len(got) == 2 && got[0] == hp[0] && got[1] == hp[1]
		})
		_ = c.Close()
	}
	mc := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer mc.Close()
	s.waitFor(ctx, m.Addr+" to report role:master", func() bool {
		info, err := mc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	})
}

// WaitReplicaLinked waits until r replicates from the current master with
// its link up.
func (s *Sentinel) WaitReplicaLinked(r *Server) {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), failoverTimeout)
	defer cancel()
	s.waitLinked(ctx, r)
}

func (s *Sentinel) waitLinked(ctx context.Context, r *Server) {
	s.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	s.waitFor(ctx, r.Addr+" to link up to its master", func() bool {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
	})
}

// CutReplication stops replication from the master m: the replica's link is
// closed and its reconnects are refused, while clients and sentinels are
// served as before. Writes acknowledged by m from now on exist only on m.
func (s *Sentinel) CutReplication(m *Server) {
	s.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "ACL", "SETUSER", replUser, "off").Err(); err != nil {
		s.tb.Fatalf("redistest: disable replication user on %s: %v", m.Addr, err)
	}
	if err := c.ClientKillByFilter(ctx, "USER", replUser).Err(); err != nil && !strings.Contains(err.Error(), "No such client") {
		s.tb.Fatalf("redistest: close replication links on %s: %v", m.Addr, err)
	}
}

// HealReplication lets replicas connect to m again.
func (s *Sentinel) HealReplication(m *Server) {
	s.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "ACL", "SETUSER", replUser, "on").Err(); err != nil {
		s.tb.Fatalf("redistest: enable replication user on %s: %v", m.Addr, err)
	}
}

func (s *Sentinel) waitFor(ctx context.Context, what string, cond func() bool) {
	s.tb.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			s.tb.Fatalf("redistest: timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
