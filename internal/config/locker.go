package config

import (
	"crypto/tls"
	"database/sql"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// DefaultEtcdDialTimeout is lock.etcd.dial_timeout when it is 0.
const DefaultEtcdDialTimeout = 5 * time.Second

// DefaultEtcdElectionTimeout is lock.etcd.election_timeout when it is 0:
// etcd's own default --election-timeout.
const DefaultEtcdElectionTimeout = time.Second

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
// for lock.etcd (when the etcd back end is linked: RegisterEtcd), and close
// stops the Locker's watch and closes the client.
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
		if err := c.CheckLinked(); err != nil {
			return nil, nil, err
		}
		return etcdLocker(c.Lock.Etcd, opts)
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

// etcdLocker builds the Locker of lock.backend etcd; nil until the etcd
// back end is linked (RegisterEtcd).
var etcdLocker func(EtcdConfig, []lock.Option) (*lock.Locker, func() error, error)

// RegisterEtcd is how the etcd back end (internal/etcdclient, linked by the
// public package etcd) makes lock.backend etcd work: f builds a Locker over a
// new client for the section, and its close stops the Locker and closes the
// client. Without it, NewLocker refuses lock.backend etcd with a Error
// naming the import. Loading and validation never need it.
func RegisterEtcd(f func(EtcdConfig, []lock.Option) (*lock.Locker, func() error, error)) {
	etcdLocker = f
}

// CheckLinked returns an *Error naming the import a program needs for
// lock.backend etcd when it does not link the etcd back end; nil otherwise.
func (c *Common) CheckLinked() error {
	if c.Lock.Backend == BackendEtcd && etcdLocker == nil {
		return &Error{Field: "lock.backend", Msg: `etcd needs the etcd back end linked into this program: add import _ "github.com/lockstep-dev/lockstep/etcd" to its main package (Lockstep's own binaries have it)`}
	}
	return nil
}

// CheckLinked is Common.CheckLinked, and for demo jobs on demo.store
// postgres (worker.demo) an *Error naming the import of the PostgreSQL
// driver when the program does not link it.
func (c *WorkerConfig) CheckLinked() error {
	if err := c.Common.CheckLinked(); err != nil {
		return err
	}
	if c.Worker.Demo && c.Demo.Store == DemoPostgres && !slices.Contains(sql.Drivers(), PostgresDriver) {
		return &Error{Field: "demo.store", Msg: `postgres needs a PostgreSQL driver linked into this program: add import _ "github.com/jackc/pgx/v5/stdlib" to its main package (cmd/worker has it)`}
	}
	return nil
}

// EtcdConnection is what the etcd client needs beyond the endpoints: the
// password (read from PasswordFile when the configuration was built by hand
// rather than loaded) and the TLS configuration (nil: plain).
type EtcdConnection struct {
	Password string
	TLS      *tls.Config
}

// Connection returns the password and TLS configuration of e.
func (e EtcdConfig) Connection() (EtcdConnection, error) {
	if e.Password == "" && e.PasswordFile != "" {
		pw, err := readPasswordFile("lock.etcd.password_file", e.PasswordFile)
		if err != nil {
			return EtcdConnection{}, err
		}
		e.Password = pw
	}
	t, err := e.TLS.build("lock.etcd.tls")
	if err != nil {
		return EtcdConnection{}, err
	}
	return EtcdConnection{Password: string(e.Password), TLS: t}, nil
}
