package jobs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Job describes the task a handler runs.
type Job struct {
	ID       string // asynq task id
	Type     string
	Queue    string
	Attempt  int // 1 on the first run; each failed run adds one, contention requeues do not
	MaxRetry int
	Resource string // the lock's resource name, "" for a handler without a lock
	Fence    int64  // the lock's fencing token, 0 without a lock (per permit with a Limit)
	Permit   int    // which of the Limit permits the task holds, 0-based (0 for a lock)
	// Admitted is when its rate limit admitted the run, on the Redis
	// server's clock (the limit's); zero without a Rate.
	Admitted time.Time

	limit int // the Spec's Limit (1: a lock), for the take
	// turn is the emission interval of a rate decided with the lock (one
	// admission): each waiter ahead starts at least that long after the
	// one before it, which the fallback of a parked task allows for.
	turn time.Duration
}

// Contention is what a handler's task does when its lock is busy.
type Contention int

const (
	// Requeue puts the task back in its queue with jittered backoff, to be
	// woken by the next release, without counting a failure or using its
	// retry budget (G6 in the README's guarantees). It is the default.
	Requeue Contention = iota
	// Skip completes the task without running the handler: the busy
	// resource means the same work is running already.
	Skip
	// Wait waits in the worker, with the backoff, up to Spec.ContentionWait
	// for the lock, and requeues the task if it is still busy.
	Wait
)

// Spec is one registered task type: how to decode its payload, which lock
// its handler needs and the handler itself. The public worker package builds
// Specs from typed handlers; the demo job is one too.
type Spec struct {
	Type string
	// Decode parses and checks a payload. An error archives the task at once:
	// a payload that cannot be decoded will not decode on a retry either.
	Decode func(payload []byte) (any, error)
	// Resource names the lock the handler runs under, from the decoded
	// payload; nil means no lock. An empty name is an invalid payload.
	Resource func(payload any) string
	// TTL of the lock; 0 takes the server's default.
	TTL time.Duration
	// Limit is how many tasks may hold the resource at once, each on a
	// permit with its own fence (lock.Permits); 0 or 1 is a lock. The
	// contention policy applies when every permit is held.
	Limit int
	// Contention says what a busy lock means for this type (default Requeue).
	Contention Contention
	// ContentionWait bounds the wait of the Wait policy.
	ContentionWait time.Duration
	// StallAfter gives a run's hold up (reason stalled) after that long
	// without the handler's Progress; MaxHold after that long held (reason
	// max_hold). Either releases the lock at once and cancels the run
	// (watchdog.StallAfter, watchdog.MaxHold); 0: no bound.
	StallAfter, MaxHold time.Duration
	// Rate names the rate limit a task runs under, from the decoded
	// payload: its key and its limit (lock.Rate); nil means none. It is
	// decided before the lock is taken: a task over its rate is delayed to
	// the moment it may run, never failed (rate.go). An empty key or a bad
	// limit is an invalid payload.
	Rate func(payload any) (key string, r lock.Rate)
	// Fair names the tenant a task belongs to and the tenant's weight, from
	// the decoded payload; nil means none. The tasks of the type in one
	// queue share the workers among their tenants in proportion to the
	// weights, decided before the rate and the lock (fair.go). An empty
	// tenant or a weight outside 1 to lock.MaxFairWeight is an invalid
	// payload.
	Fair func(payload any) (tenant string, weight int)
	// Run is the handler. Its context is cancelled, with a cause matching
	// lock.ErrLockLost, when the lock is lost.
	Run func(ctx context.Context, job Job, payload any) error
}

// Registry maps task types to their Specs.
type Registry struct {
	specs map[string]*Spec
}

// NewRegistry checks specs and indexes them by type. Types must be unique
// and every spec needs Decode and Run.
func NewRegistry(specs []Spec) (*Registry, error) {
	r := &Registry{specs: make(map[string]*Spec, len(specs))}
	var errs []error
	for i := range specs {
		s := specs[i]
		switch {
		case s.Type == "":
			errs = append(errs, fmt.Errorf("jobs: handler %d has an empty task type", i))
			continue
		case r.specs[s.Type] != nil:
			errs = append(errs, fmt.Errorf("jobs: task type %q is registered twice", s.Type))
			continue
		case s.Decode == nil || s.Run == nil:
			errs = append(errs, fmt.Errorf("jobs: task type %q: Decode and Run are required", s.Type))
			continue
		case s.TTL < 0:
			errs = append(errs, fmt.Errorf("jobs: task type %q: negative lock TTL %v", s.Type, s.TTL))
			continue
		case s.Limit < 0 || (s.Limit > 1 && s.Resource == nil):
			errs = append(errs, fmt.Errorf("jobs: task type %q: limit %d needs a lock and must be at least 1", s.Type, s.Limit))
			continue
		case s.Contention < Requeue || s.Contention > Wait:
			errs = append(errs, fmt.Errorf("jobs: task type %q: unknown contention policy %d", s.Type, s.Contention))
			continue
		case s.Contention == Wait && s.ContentionWait <= 0:
			errs = append(errs, fmt.Errorf("jobs: task type %q: the wait policy needs a positive bound, got %v", s.Type, s.ContentionWait))
			continue
		}
		r.specs[s.Type] = &s
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return r, nil
}

// Lookup returns the Spec of a task type.
func (r *Registry) Lookup(taskType string) (*Spec, bool) {
	s, ok := r.specs[taskType]
	return s, ok
}

// Len returns the number of registered task types.
func (r *Registry) Len() int { return len(r.specs) }

// Types returns the registered task types.
func (r *Registry) Types() []string {
	return slices.Sorted(maps.Keys(r.specs))
}
