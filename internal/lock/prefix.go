package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrefixClaimTTL is how long a claim of a key prefix by a back end lasts
// unless its process renews it (every third of it while it runs): once every
// process of one back end has stopped, another may serve the prefix after
// at most this long.
const PrefixClaimTTL = time.Minute

// BackendName is the Locker's back end as lock.backend names it: redis (a
// single server, Sentinel or Cluster), redlock or etcd.
func (l *Locker) BackendName() string {
	if l.kind == "single" {
		return "redis"
	}
	return l.kind
}

// BackendConflictError is ClaimPrefix's error when another back end serves
// the prefix: a process that took locks beside it would grant what that
// back end has granted already.
type BackendConflictError struct {
	Prefix  string
	Serving string // the back end that serves the prefix
	Mine    string // the Locker's
}

func (e *BackendConflictError) Error() string {
	return fmt.Sprintf("lock.backend: %s, but lock.backend %s already serves the key prefix %q (a process of it ran within the last %v): "+
		"every process of one prefix must use one back end, or the same resource is locked in both; use lock.backend %s, or another lock.prefix",
		e.Mine, e.Serving, e.Prefix, PrefixClaimTTL, e.Serving)
}

// ClaimPrefix records on c, the Redis of the deployment (its queues' Redis,
// whatever the lock back end), that the Locker's back end serves its key
// prefix for PrefixClaimTTL, or renews that claim. When another back end
// serves it, it returns a *BackendConflictError and claims nothing.
func (l *Locker) ClaimPrefix(ctx context.Context, c redis.UniversalClient) error {
	v, err := run(ctx, c, scriptClaim, []string{l.prefix + "backend"}, l.BackendName(), PrefixClaimTTL.Milliseconds())
	if err != nil {
		return fmt.Errorf("lock: claim the key prefix %q: %w", l.prefix, err)
	}
	if s, _ := v.(string); s != l.BackendName() {
		return &BackendConflictError{Prefix: l.prefix, Serving: s, Mine: l.BackendName()}
	}
	return nil
}
