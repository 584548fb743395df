// Package redistest starts private redis-server processes for tests.
//
// Every server listens on a free loopback port, keeps no data on disk (unless
// started with StartAOF) and is killed in t.Cleanup, so tests that use it can
// run in parallel. A Server can be killed (SIGKILL), paused (SIGSTOP), resumed
// (SIGCONT) and restarted on the same port, which is what fault tests need.
// Nothing here mocks Redis.
//
// Besides single servers: StartN (independent masters, e.g. Redlock nodes),
// StartWithReplica, StartCluster (a Redis Cluster of masters) and
// StartSentinel (a master, a replica and three sentinels, with Failover and
// CutReplication to lose a write on purpose).
//
// When redis-server is not installed, Start fails the test with a message that
// says how to install it; it never skips.
package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// startTimeout bounds how long a server may take to answer PING after exec.
const startTimeout = 10 * time.Second

// Server is one redis-server process owned by a test. Kill, Pause, Resume
// and Restart (on the same port, with no data, or with what its AOF holds for
// a server from StartAOF) come from proctest.
type Server struct {
	*proctest.Proc
	tb   testing.TB
	Addr string // host:port on 127.0.0.1
	Port int
	tls  *tls.Config // the client side of a server from StartTLS; nil: plain TCP
}

// Start starts a private redis-server. Extra config directives may be given
// as "name value" pairs, e.g. Start(t, "maxmemory", "10mb").
func Start(tb testing.TB, directives ...string) *Server {
	tb.Helper()
	return launch(tb, nil, func(port int, dir string) []string {
		return append(append(serverArgs(port, dir), noStrayReplication...), expand(directives)...)
	})
}

// TLS is what StartTLS needs: the server's certificate, key and CA bundle
// (PEM files), and the client side that reaches it (the CA, and a client
// certificate of it).
type TLS struct {
	Cert, Key, CA string
	Client        *tls.Config
}

// StartTLS starts a private redis-server that listens on TLS only (no plain
// port) and asks clients for a certificate of the CA (tls-auth-clients yes,
// its default). Client connects with t.Client; Addr is the TLS port.
func StartTLS(tb testing.TB, t TLS, directives ...string) *Server {
	tb.Helper()
	return launch(tb, t.Client, func(port int, dir string) []string {
		args := append(serverArgs(port, dir), "--port", "0", // the later --port wins: no plain port
			"--tls-port", strconv.Itoa(port),
			"--tls-cert-file", t.Cert, "--tls-key-file", t.Key, "--tls-ca-cert-file", t.CA)
		return append(append(args, noStrayReplication...), expand(directives)...)
	})
}

// noStrayReplication hides REPLICAOF and SLAVEOF on a server of its own (a
// replica of StartWithReplica follows its master by its configuration): the
// sentinels of another test that run in parallel keep trying to reach the
// master they lost, and, finding a new server on its freed port, would make
// it their replica (dropping its data, killing its clients).
var noStrayReplication = []string{
	"--rename-command", "REPLICAOF", "redistest-private-replicaof",
	"--rename-command", "SLAVEOF", "redistest-private-slaveof",
}

// serverArgs are the flags of every data node: port on loopback, no
// persistence, its own directory and log file, in the foreground.
func serverArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", logFile(dir, port),
		"--daemonize", "no",
		"--repl-diskless-sync-delay", "0", // replicas link up at once
	}
}

// launch starts redis-server with the arguments args returns for a free port
// and the server's own directory, retrying on another port when the bind
// fails; a non-nil tlsConf is the client side of a server that speaks TLS.
// The server is killed in tb's cleanup.
func launch(tb testing.TB, tlsConf *tls.Config, args func(port int, dir string) []string) *Server {
	tb.Helper()
	bin := proctest.Binary(tb, "redis-server", "redis-server")
	dir := proctest.TempDir(tb)
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try a few
		port, err := proctest.FreePort()
		if err != nil {
			tb.Fatalf("redistest: free port: %v", err)
		}
		s := &Server{tb: tb, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, tls: tlsConf}
		s.Proc = proctest.New(tb, proctest.Spec{
			What: "redis-server " + s.Addr, Bin: bin, Args: args(port, dir),
			Log: logFile(dir, port), Ready: s.waitReady,
		})
		if lastErr = s.Start(); lastErr == nil {
			tb.Cleanup(s.Kill)
			return s
		}
	}
	tb.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

func logFile(dir string, port int) string {
	return filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))
}

// StartAOF starts a private redis-server that persists every write to its
// append-only file before replying (appendonly yes, appendfsync always), so
// that Kill followed by Restart loses no acknowledged write: the restarted
// server loads the AOF from the same directory.
func StartAOF(tb testing.TB, directives ...string) *Server {
	tb.Helper()
	return Start(tb, append([]string{"appendonly", "yes", "appendfsync", "always"}, directives...)...)
}

// StartN starts n independent servers.
func StartN(tb testing.TB, n int) []*Server {
	tb.Helper()
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = Start(tb)
	}
	return servers
}

// StartWithReplica starts a master and one replica of it, and returns once the
// replica reports its link to the master up.
func StartWithReplica(tb testing.TB) (master, replica *Server) {
	tb.Helper()
	master = Start(tb)
	replica = Start(tb, "replicaof", fmt.Sprintf("127.0.0.1 %d", master.Port))
	c := replica.Client()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return master, replica
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("redistest: replica of %s never linked up: %v", master.Addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Client returns a new client for the server, closed when the test ends.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	return client(s.tb, &redis.Options{Addr: s.Addr, TLSConfig: s.tls}, opts, redis.NewClient)
}

// client makes a client of o, tuned by opts, closed when tb's test ends.
func client[O any, C io.Closer](tb testing.TB, o *O, opts []func(*O), newClient func(*O) C) C {
	for _, f := range opts {
		f(o)
	}
	c := newClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// addrsOf returns the servers' addresses.
func addrsOf(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// waitReady waits for PONG (proctest's Ready).
func (s *Server) waitReady(exited <-chan struct{}) error {
	return waitPong(&redis.Options{Addr: s.Addr, TLSConfig: s.tls}, exited, startTimeout)
}

// waitPong waits up to timeout for the server that opts reach (its address,
// TLS) to answer PING, or for exited to close (the process died during its
// start).
func waitPong(opts *redis.Options, exited <-chan struct{}, timeout time.Duration) error {
	o := *opts
	o.MaxRetries, o.DialTimeout = -1, time.Second
	c := redis.NewClient(&o)
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-exited:
			return errors.New("exited during start")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG from %s within %v: %w", o.Addr, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expand turns "name", "value" pairs into redis-server flags.
func expand(directives []string) []string {
	out := make([]string, 0, len(directives))
	for i := 0; i < len(directives); i += 2 {
		out = append(out, "--"+directives[i])
		if i+1 < len(directives) {
			out = append(out, directives[i+1])
		}
	}
	return out
}
