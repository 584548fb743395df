package config

import (
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// NewLocker builds the Locker the lock section describes; both binaries use
// it, so that their locks are the same.
//
// With lock.backend redis it is lock.New over client (the redis section's
// client, of the kind redis.mode says) and close does nothing. With redlock
// it is lock.NewRedlock over one new client per lock.nodes address, reached
// with the redis section's credentials, TLS, timeouts and pool size, and close
// closes those clients. Either way the Locker has lock.prefix, and
// lock.wait_replicas or lock.node_timeout when set; opts (e.g.
// lock.WithMetrics) come last.
func (c *Common) NewLocker(client redis.UniversalClient, opts ...lock.Option) (l *lock.Locker, close func() error, err error) {
	base := []lock.Option{lock.WithPrefix(c.Lock.Prefix)}
	if c.Lock.WaitReplicas > 0 {
		base = append(base, lock.WaitReplicas(c.Lock.WaitReplicas, c.Lock.WaitReplicasTimeout))
	}
	if c.Lock.NodeTimeout > 0 {
		base = append(base, lock.WithNodeTimeout(c.Lock.NodeTimeout))
	}
	opts = append(base, opts...)
	if c.Lock.Backend != BackendRedlock {
		return lock.New(client, opts...), func() error { return nil }, nil
	}
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
