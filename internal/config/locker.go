package config

import (
	"cmp"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// DefaultEtcdDialTimeout is lock.etcd.dial_timeout when it is 0.
const DefaultEtcdDialTimeout = 5 * time.Second

// DefaultEtcdElectionTimeout is lock.etcd.election_timeout when it is 0:
// etcd's own default --election-timeout.
const DefaultEtcdElectionTimeout = time.Second

// The etcd client's gRPC keep-alive: a member that stops answering (a
// frozen process, a black-holed network) keeps its TCP connection open, so
// without pings the client's calls would go on being sent to it. gRPC pings
// no more often than every 10s; etcd's server accepts pings every 5s
// (--grpc-keepalive-min-time) while a stream is open, which the Locker's
// watch is.
const (
	etcdKeepAliveTime    = 10 * time.Second
	etcdKeepAliveTimeout = 2 * time.Second
)

// MinEtcdTTL is the shortest safe lock.ttl with lock.backend etcd, for a
// renew interval (0: a third of the ttl) and the members' election timeout.
// A leader cut off from its quorum steps down after at most two election
// timeouts (raft's CheckQuorum runs once per election timeout), and until
// then its lessor, which alone expires leases, may revoke a lease whose last
// keep-alive reached it more than a TTL ago: the renewals since went to the
// new leader. The last keep-alive it saw is at most one renew interval
// before the cut, so a TTL of renew interval + 2 × election timeout expires
// nothing there before it steps down. With ttl/3 renewals that is 3 ×
// election timeout. No TTL covers a leader whose process stalls for longer
// than the TTL on etcd 3.4.23: see docs/locking.md (etcd).
func MinEtcdTTL(renew, election time.Duration) time.Duration {
	if renew == 0 {
		return 3 * election
	}
	return renew + 2*election
}

// NewLocker builds the Locker the lock section describes; both binaries use
// it, so that their locks are the same.
//
// With lock.backend redis it is lock.New over client (the redis section's
// client, of the kind redis.mode says) and close does nothing. With redlock
// it is lock.NewRedlock over one new client per lock.nodes address, reached
// with the redis section's credentials, TLS, timeouts and pool size, and close
// closes those clients. With etcd it is lock.NewEtcd over a new etcd client
// for lock.etcd, and close stops the Locker's watch and closes the client.
// Either way the Locker has lock.prefix, and lock.wait_replicas or
// lock.node_timeout when set, and lock.fence_ttl on the Redis back ends;
// opts (e.g. lock.WithMetrics) come last.
func (c *Common) NewLocker(client redis.UniversalClient, opts ...lock.Option) (l *lock.Locker, close func() error, err error) {
	base := []lock.Option{lock.WithPrefix(c.Lock.Prefix)}
	if c.Lock.WaitReplicas > 0 {
		base = append(base, lock.WaitReplicas(c.Lock.WaitReplicas, c.Lock.WaitReplicasTimeout))
	}
	if c.Lock.NodeTimeout > 0 {
		base = append(base, lock.WithNodeTimeout(c.Lock.NodeTimeout))
	}
	if c.Lock.Backend != BackendEtcd && c.Lock.FenceTTL > 0 { // etcd's fences are revisions: no counter
		base = append(base, lock.WithFenceTTL(c.Lock.FenceTTL))
	}
	opts = append(base, opts...)
	switch c.Lock.Backend {
	case BackendRedlock:
		return c.newRedlock(opts)
	case BackendEtcd:
		cfg, err := c.Lock.Etcd.ClientConfig()
		if err != nil {
			return nil, nil, err
		}
		cl, err := clientv3.New(cfg)
		if err != nil {
			return nil, nil, &Error{Field: "lock.etcd.endpoints", Msg: "cannot create the etcd client", Err: cause(err)}
		}
		l := lock.NewEtcd(cl, opts...)
		return l, func() error { return errors.Join(l.Close(), cl.Close()) }, nil
	}
	return lock.New(client, opts...), func() error { return nil }, nil
}

func (c *Common) newRedlock(opts []lock.Option) (*lock.Locker, func() error, error) {
	nodes := make([]redis.UniversalClient, len(c.Lock.Nodes))
	closeAll := func() error {
		var errs []error
		for _, n := range nodes {
			if n != nil {
				errs = append(errs, n.Close())
			}
		}
		return errors.Join(errs...)
	}
	for i, addr := range c.Lock.Nodes {
		o, err := c.Redis.NodeOptions(addr)
		if err != nil {
			_ = closeAll()
			return nil, nil, err
		}
		nodes[i] = redis.NewClient(o)
	}
	if n := len(nodes); n == 0 || n%2 == 0 { // loading rejects this; a hand-built config may not
		_ = closeAll()
		return nil, nil, &Error{Field: "lock.nodes", Msg: "must list an odd number of nodes, 3 or more (usually 5)"}
	}
	return lock.NewRedlock(nodes, opts...), closeAll, nil
}

// ClientConfig returns the etcd client configuration for this section:
// endpoints (a bare host:port gets the scheme TLS implies), credentials
// (reading PasswordFile if the config was built by hand rather than loaded),
// TLS, the dial timeout and gRPC keep-alive pings. The client dials in the background and logs
// nothing: its errors reach the Locker's callers.
func (e EtcdConfig) ClientConfig() (clientv3.Config, error) {
	if e.Password == "" && e.PasswordFile != "" {
		pw, err := readPasswordFile("lock.etcd.password_file", e.PasswordFile)
		if err != nil {
			return clientv3.Config{}, err
		}
		e.Password = pw
	}
	t, err := e.TLS.build("lock.etcd.tls")
	if err != nil {
		return clientv3.Config{}, err
	}
	scheme := "http://"
	if t != nil {
		scheme = "https://"
	}
	eps := make([]string, len(e.Endpoints))
	for i, ep := range e.Endpoints {
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		eps[i] = ep
	}
	return clientv3.Config{
		Endpoints:   eps,
		Username:    e.Username,
		Password:    string(e.Password),
		TLS:         t,
		DialTimeout: cmp.Or(e.DialTimeout, DefaultEtcdDialTimeout),
		// A member that hangs is dropped from the client's choice once a
		// ping goes unanswered; per-call timeouts are the lock package's.
		DialKeepAliveTime:    etcdKeepAliveTime,
		DialKeepAliveTimeout: etcdKeepAliveTimeout,
		Logger:               zap.NewNop(),
	}, nil
}
