package lock

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// backend is where a Locker's leases live. There is one type per back end,
// chosen once at construction: single (one Redis deployment: a server, a
// Sentinel-managed master or a Cluster), redlock (a quorum of independent
// Redis masters) and etcd (leases and revisions of an etcd cluster).
//
// The Locker owns what is common: tokens, the lease's state (a loss or a
// release is final), metrics, waiting with backoff. A back end only talks to
// its store, and reports a loss as a *LostError without recording it; the
// Locker records it in the lease.
type backend interface {
	// acquire makes one attempt to take s (its resource, keys, token, ttl and
	// owner are set). On success it sets s.token (a re-entry joins the
	// holder's token), s.fence and s.reentry and reports true; it reports
	// false when another holder has the lock.
	acquire(ctx context.Context, s *Lease) (bool, error)
	// renew renews every lease of leases (none known to be lost) and writes
	// one result per lease into results: nil when renewed, a *LostError when
	// the lock is no longer ours, or the transport error that kept the
	// renewal from happening. The errors name the operation and the resource.
	renew(ctx context.Context, leases []*Lease, results []error)
	// release gives s up: nil when released (or one reentrant hold given
	// back), a *LostError when the lock was no longer ours (then it left the
	// next holder's lock alone), or a transport error.
	release(ctx context.Context, s *Lease) error
	// options lists the Option names that apply to this back end; New,
	// NewRedlock and NewEtcd reject the others.
	options() []string
}

// clientKeeper is implemented by the back end whose locks live in the Redis
// deployment of the client given to New (single), the only one where a
// script may touch a lock together with other keys of that Redis and where
// that Redis's own notices (CLIENT TRACKING) speak for the lock.
type clientKeeper interface {
	keepsOnClient() bool
}

func (b *single) keepsOnClient() bool { return true }

// LossNotifier is implemented by back ends that hear from their store the
// moment a held lock is deleted or overwritten (etcd's watch). See
// Locker.NotifyLoss.
type lossNotifier interface {
	notifyLoss(f func(*Lease, error))
}

// option names, as the rejection message gives them.
const (
	optPrefix       = "WithPrefix"
	optFenceTTL     = "WithFenceTTL"
	optWaitReplicas = "WaitReplicas"
	optBackoff      = "WithBackoff"
	optMaxWait      = "WithMaxWait"
	optMetrics      = "WithMetrics"
	optNodeTimeout  = "WithNodeTimeout"
	optClockDrift   = "WithClockDrift"
)

// commonOptions apply to every back end.
var commonOptions = []string{optPrefix, optBackoff, optMaxWait, optMetrics}

// checkOptions returns an error naming every option used that kind does not take.
func checkOptions(kind string, used, accepted []string) error {
	var bad []string
	for _, u := range used {
		if !slices.Contains(accepted, u) && !slices.Contains(commonOptions, u) && !slices.Contains(bad, u) {
			bad = append(bad, u)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("lock: %s does not apply to the %s back end", strings.Join(bad, ", "), kind)
}
