// Package etcdtest starts private etcd server processes for tests, the way
// redistest starts Redis: every member listens on free loopback ports, keeps
// its data in a private directory (in memory, /dev/shm, where there is one)
// and is killed in t.Cleanup, so tests that use it can run in parallel. A
// Member can be killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT) and
// restarted with its data, which is what fault tests need. Nothing here mocks
// etcd.
//
// Start starts one member; StartCluster starts n members of one cluster. The
// members run with short raft timings (heartbeat 10ms, election 100ms), so a
// killed leader is replaced within a fraction of a second.
//
// When etcd is not installed (Debian's etcd-server package), Start fails the
// test with a message that says how to install it; it never skips.
package etcdtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// startTimeout bounds how long a cluster may take to become healthy.
const startTimeout = 20 * time.Second

// ElectionTimeout is the members' --election-timeout (their heartbeat is
// 10ms): what a config's lock.etcd.election_timeout says of them.
const ElectionTimeout = 100 * time.Millisecond

// Cluster is a set of etcd members owned by a test.
type Cluster struct {
	tb      testing.TB
	Members []*Member
}

// Member is one etcd process. Kill (its data stays), Pause, Resume and
// Restart (with its data, on the same ports; it returns once the process
// runs, not once it is healthy: a lone member of a dead cluster cannot be)
// come from proctest.
type Member struct {
	*proctest.Proc
	tb        testing.TB
	Name      string
	ClientURL string // http://127.0.0.1:port
	PeerURL   string
	dir       string
}

// Start starts a one-member cluster.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	return StartCluster(tb, 1)
}

// StartCluster starts an n-member cluster and returns once every member
// reports healthy (a leader is elected and each member serves reads).
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	bin := proctest.Binary(tb, "etcd", "etcd-server")
	var lastErr error
	for range 3 { // a free port can be taken between probe and bind; try again
		c, err := launch(tb, bin, n)
		if err == nil {
			return c
		}
		lastErr = err
	}
	tb.Fatalf("etcdtest: start %d-member cluster: %v", n, lastErr)
	return nil
}

func launch(tb testing.TB, bin string, n int) (*Cluster, error) {
	c := &Cluster{tb: tb}
	var initial []string
	token := fmt.Sprintf("etcdtest-%d-%d", os.Getpid(), time.Now().UnixNano())
	for i := range n {
		cport, err := proctest.FreePort()
		if err != nil {
			return nil, err
		}
		pport, err := proctest.FreePort()
		if err != nil {
			return nil, err
		}
		m := &Member{
			tb:        tb,
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: "http://127.0.0.1:" + strconv.Itoa(cport),
			PeerURL:   "http://127.0.0.1:" + strconv.Itoa(pport),
			dir:       proctest.TempDir(tb), // etcd fsyncs every commit: in memory, a shared disk does not slow it
		}
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		args := []string{
			"--name", m.Name,
			"--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", m.ClientURL,
			"--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL,
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--heartbeat-interval", "10",
			"--election-timeout", strconv.Itoa(int(ElectionTimeout.Milliseconds())),
			"--logger", "zap",
			"--log-level", "warn",
			"--log-outputs", filepath.Join(m.dir, "etcd.log"),
		}
		m.Proc = proctest.New(tb, proctest.Spec{What: "etcd " + m.Name, Bin: bin, Args: args, Log: filepath.Join(m.dir, "etcd.log")})
	}
	for _, m := range c.Members {
		if err := m.Start(); err != nil {
			c.killAll()
			return nil, err
		}
	}
	tb.Cleanup(c.killAll)
	for _, m := range c.Members {
		if err := m.waitHealthy(); err != nil {
			c.killAll()
			return nil, err
		}
	}
	return c, nil
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.ClientURL
	}
	return out
}

// Client returns a new client for the cluster, closed when the test ends. It
// dials in the background (no blocking dial) with short timeouts.
func (c *Cluster) Client(opts ...func(*clientv3.Config)) *clientv3.Client {
	c.tb.Helper()
	cfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	for _, f := range opts {
		f(&cfg)
	}
	cl, err := clientv3.New(cfg)
	if err != nil {
		c.tb.Fatalf("etcdtest: client: %v", err)
	}
	c.tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Leader returns the member that is raft leader now, asking each running
// member; it fails the test when none answers within a few seconds.
func (c *Cluster) Leader() *Member {
	c.tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range c.Members {
			if m.isLeader() {
				return m
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.tb.Fatalf("etcdtest: no member reports itself leader")
	return nil
}

func (m *Member) isLeader() bool {
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: 200 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		return false
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := cl.Status(ctx, m.ClientURL)
	return err == nil && st.Header.MemberId == st.Leader
}

// WaitHealthy waits until the member answers healthy (it has a leader and
// serves reads), failing the test after a while.
func (m *Member) WaitHealthy() {
	m.tb.Helper()
	if err := m.waitHealthy(); err != nil {
		m.tb.Fatalf("etcdtest: %v", err)
	}
}

// waitHealthy polls the member's /health until it answers healthy.
func (m *Member) waitHealthy() error {
	done := m.Exited()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("etcd %s exited during start; log:\n%s", m.Name, m.LogTail(2000))
		default:
		}
		resp, err := hc.Get(m.ClientURL + "/health")
		if err == nil {
			var buf [256]byte
			k, _ := resp.Body.Read(buf[:])
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(buf[:k]), `"true"`) {
				return nil
			}
			err = fmt.Errorf("/health: %s %s", resp.Status, buf[:k])
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("etcd %s not healthy within %v: %v; log:\n%s", m.Name, startTimeout, lastErr, m.LogTail(2000))
}

func (c *Cluster) killAll() {
	for _, m := range c.Members {
		m.Kill()
	}
}
