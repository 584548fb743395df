package lock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// RenewScript exposes the single-lease renew script to benchmarks.
func RenewScript() *redis.Script { return scriptRenew }

// Leave makes waiter id leave resource's queue, as a waiting Acquire does
// when it gives up (leave.lua, and the release of a hand-off it finds).
func Leave(l *Locker, resource, id string) {
	s := &Lease{locker: l, keys: l.keysFor(resource), resource: resource, ttl: time.Second, wait: &waitState{id: id}}
	l.be.(fairWaiter).leave(context.Background(), s)
}

// EtcdWaiting is how many Acquires of resource wait in l's process on its
// etcd watch (etcdWaits): a test's signal that a waiter has made its busy
// attempt and waits.
func EtcdWaiting(l *Locker, resource string) int {
	b := l.be.(*etcdBackend)
	b.mu.Lock()
	defer b.mu.Unlock()
	if ws := b.waits[l.keysFor(resource).base]; ws != nil {
		return len(ws.list)
	}
	return 0
}
