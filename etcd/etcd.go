// Package etcd puts Lockstep's locks in an etcd cluster: strict locks whose
// holders are decided by etcd's raft quorum, with fences from etcd's
// revisions. It is a package of its own so that only the programs that
// import it link etcd's client and gRPC.
//
// From code, NewLocker gives the same *lockstep.Locker as lockstep.NewLocker,
// over an etcd client:
//
//	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd-1:2379"}})
//	...
//	locker := etcd.NewLocker(cl)
//	defer locker.Close(ctx)
//	err = locker.WithLock(ctx, "report:daily", run, lockstep.TTL(30*time.Second))
//
// A worker or scheduler binary accepts lock.backend: etcd only when it links
// this package; a binary of your own built with worker.Main imports it for
// its side effect:
//
//	import _ "github.com/lockstep-dev/lockstep/etcd"
//
// Without it, such a configuration exits 2 with a message naming this
// import. The cmd/ binaries link it. docs/locking.md compares the back ends.
package etcd

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/locklink"
)

// NewLocker returns a Locker whose locks live in the etcd cluster of client:
// a lock on resource R is the key lockstep:{R}, created only if absent and
// bound to an etcd lease of the lock's TTL (rounded up to whole seconds; the
// server raises one below its minimum); its fence is the key's create
// revision. A loss is heard at once through a watch on the lock keys.
// KeyPrefix and the tracing and watchdog options apply; WaitReplicas does
// not (it panics, as a misuse). Close the Locker when done: it stops the
// watch; client stays the caller's to close.
func NewLocker(client *clientv3.Client, opts ...lockstep.Option) *lockstep.Locker {
	return locklink.New(func(o []lock.Option) *lock.Locker { return etcdclient.NewLocker(client, o...) }, opts).(*lockstep.Locker)
}
