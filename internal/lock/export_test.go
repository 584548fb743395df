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
