package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// Defaults for a Locker.
const (
	DefaultPrefix   = "lockstep:"
	DefaultFenceTTL = 30 * 24 * time.Hour
)

// Locker acquires leases on named resources in one Redis deployment (a single
// server, a Sentinel-managed master or a Cluster), or on a quorum of
// independent masters (NewRedlock).
type Locker struct {
	client   redis.UniversalClient
	prefix   string
	fenceTTL time.Duration
	replicas int
	replWait time.Duration
	backoff  Backoff
	maxWait  time.Duration
	metrics  *metrics.Metrics

	// acquire results, resolved once: label lookups stay off the hot path
	acquired, busy, failed prometheus.Counter

	rl *redlock // set by NewRedlock; nil for New
}

// Option configures a Locker.
type Option func(*Locker)

// WithPrefix sets the prefix of every Redis key (default "lockstep:").
func WithPrefix(p string) Option { return func(l *Locker) { l.prefix = p } }

// WithFenceTTL sets how long an unused fencing counter lives (default 30 days).
// A counter that expired restarts from the server's clock, so fences still
// increase; the TTL only keeps dead resources from leaving keys behind forever.
func WithFenceTTL(d time.Duration) Option { return func(l *Locker) { l.fenceTTL = d } }

// WaitReplicas makes every acquire wait until n replicas acknowledged the lock
// (Redis WAIT), within timeout. With fewer acknowledgements the acquire fails
// and releases the lock it had taken. It narrows, but does not close, the
// window in which a failover loses a lock.
func WaitReplicas(n int, timeout time.Duration) Option {
	return func(l *Locker) { l.replicas, l.replWait = n, timeout }
}

// WithBackoff sets the default wait between Acquire attempts.
func WithBackoff(b Backoff) Option { return func(l *Locker) { l.backoff = b } }

// WithMaxWait sets how long Acquire waits by default (0: until the context ends).
func WithMaxWait(d time.Duration) Option { return func(l *Locker) { l.maxWait = d } }

// WithMetrics records acquire results and latency in m.
func WithMetrics(m *metrics.Metrics) Option { return func(l *Locker) { l.metrics = m } }

// New returns a Locker over client.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	l := &Locker{
		client:   client,
		prefix:   DefaultPrefix,
		fenceTTL: DefaultFenceTTL,
		backoff:  DefaultBackoff,
	}
	for _, o := range opts {
		o(l)
	}
	l.metrics = metrics.OrNop(l.metrics)
	l.acquired = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireAcquired)
	l.busy = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireBusy)
	l.failed = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireError)
	return l
}

// Locker returns the Locker that took the lease.
func (s *Lease) Locker() *Locker { return s.locker }

// Client returns the Redis client the Locker uses (for Redlock, the first node).
func (l *Locker) Client() redis.UniversalClient { return l.client }

// Lease is one holder's claim on a resource. Its methods are safe for
// concurrent use.
type Lease struct {
	locker   *Locker
	keys     keys
	resource string
	token    string
	fence    int64
	ttl      time.Duration
	owner    string // reentrant owner id, "" for a plain lease
	reentry  bool   // this lease entered a lock its owner already held
	sent     time.Time

	state leaseState

	acquiring *sync.WaitGroup // Redlock: node answers to the acquire still on their way
}

// Key returns the resource name the lease was taken on, e.g. "lock:order:42".
func (s *Lease) Key() string { return s.resource }

// RedisKey returns the Redis key that holds the lock.
func (s *Lease) RedisKey() string { return s.keys.lock }

// Token returns the token that identifies this holder in Redis: random, with
// the holder information ParseToken reads.
func (s *Lease) Token() string { return s.token }

// Fence returns the fencing token: it strictly increases with every fresh
// acquire of the same resource, so a store that remembers the highest fence it
// saw can reject writes from a holder whose lease has since passed to another.
// A reentrant acquire returns the fence of the hold it entered.
func (s *Lease) Fence() int64 { return s.fence }

// TTL returns the lease's time to live, as acquired and as every renewal sets it.
func (s *Lease) TTL() time.Duration { return s.ttl }

// AcquiredAt returns when the acquire request was sent: the lease is valid
// until at most AcquiredAt + TTL unless renewed.
func (s *Lease) AcquiredAt() time.Time { return s.sent }

// Reentrant reports whether the lease entered a lock its owner already held.
func (s *Lease) Reentrant() bool { return s.reentry }

// TryAcquire makes one attempt to take the lock on resource for ttl. It
// returns ErrNotAcquired when another holder has it. When ctx carries an owner
// (WithOwner) and that owner already holds the lock, the hold count grows and
// the returned lease shares the holder's token and fence.
func (l *Locker) TryAcquire(ctx context.Context, resource string, ttl time.Duration) (*Lease, error) {
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("lock: acquire %q: ttl %v is below 1ms", resource, ttl)
	}
	now := time.Now()
	lease := &Lease{
		locker:   l,
		keys:     l.keysFor(resource),
		resource: resource,
		token:    tokenFor(ctx, now),
		ttl:      ttl,
		owner:    OwnerFrom(ctx),
		sent:     now,
	}
	res, err := l.acquireOnce(ctx, lease)
	l.metrics.LockAcquireDuration.Observe(time.Since(lease.sent).Seconds())
	switch {
	case err != nil:
		l.failed.Inc()
		return nil, fmt.Errorf("lock: acquire %q: %w", resource, err)
	case res == nil:
		l.busy.Inc()
		return nil, ErrNotAcquired
	}
	l.acquired.Inc()
	return res, nil
}

func (l *Locker) acquireOnce(ctx context.Context, s *Lease) (*Lease, error) {
	if l.rl != nil {
		return l.rl.acquire(ctx, l, s)
	}
	keys := []string{s.keys.lock, s.keys.fence, s.keys.owners}
	args := []any{s.token, s.ttl.Milliseconds(), l.fenceTTL.Milliseconds(), s.owner}
	var reply any
	var err error
	if l.replicas > 0 {
		// WAIT counts the writes of its own connection, so it must follow the
		// script on the same one: a pipeline on a non-cluster client.
		reply, err = l.acquireAndWait(ctx, keys, args)
	} else {
		reply, err = run(ctx, l.client, scriptAcquire, keys, args...)
	}
	if err != nil {
		return nil, err
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) == 0 {
		return nil, fmt.Errorf("unexpected reply %v", reply)
	}
	switch vals[0] {
	case int64(0):
		return nil, nil
	case int64(1), int64(2):
		if len(vals) != 3 {
			return nil, fmt.Errorf("unexpected reply %v", reply)
		}
		s.token, _ = vals[1].(string)
		s.fence, _ = vals[2].(int64)
		s.reentry = vals[0] == int64(2)
		return s, nil
	}
	return nil, fmt.Errorf("unexpected reply %v", reply)
}

func (l *Locker) acquireAndWait(ctx context.Context, keys []string, args []any) (any, error) {
	if err := scriptAcquire.Load(ctx, l.client).Err(); err != nil {
		return nil, fmt.Errorf("load script: %w", err)
	}
	var eval *redis.Cmd
	var wait *redis.IntCmd
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		eval = scriptAcquire.EvalSha(ctx, p, keys, args...)
		wait = redis.NewIntCmd(ctx, "wait", l.replicas, l.replWait.Milliseconds())
		_ = p.Process(ctx, wait)
		return nil
	})
	if err := eval.Err(); err != nil {
		return nil, err
	}
	reply := eval.Val()
	if vals, ok := reply.([]any); ok && len(vals) > 0 && vals[0] == int64(1) {
		if err == nil && wait.Val() < int64(l.replicas) {
			err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v",
				ErrReplicas, wait.Val(), l.replicas, l.replWait)
		}
		if err != nil {
			// Leave nothing behind: the lock we took is not safe to use.
			_, relErr := run(context.WithoutCancel(ctx), l.client, scriptRelease,
				[]string{keys[0], keys[2]}, vals[1], args[3])
			return nil, errors.Join(err, relErr)
		}
	}
	return reply, nil
}

// Acquire waits for the lock on resource, retrying TryAcquire with
// decorrelated-jitter backoff until it succeeds, the max wait passes
// (ErrNotAcquired) or ctx ends (an error matching both ErrNotAcquired and the
// context's error). Redis errors end the wait at once.
func (l *Locker) Acquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	w := waitConfig{backoff: l.backoff, maxWait: l.maxWait}
	for _, o := range opts {
		o(&w)
	}
	if w.maxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, w.maxWait, errMaxWait)
		defer cancel()
	}
	var delay time.Duration
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for attempt := 1; ; attempt++ {
		lease, err := l.TryAcquire(ctx, resource, ttl)
		if !errors.Is(err, ErrNotAcquired) {
			if err != nil && ctx.Err() != nil {
				return nil, waitEnded(ctx, resource, attempt)
			}
			return lease, err
		}
		if w.attempts != nil {
			*w.attempts = attempt
		}
		delay = w.backoff.Next(delay)
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return nil, waitEnded(ctx, resource, attempt)
		case <-timer.C:
		}
	}
}

var errMaxWait = errors.New("max wait reached")

func waitEnded(ctx context.Context, resource string, attempts int) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, errMaxWait) {
		return fmt.Errorf("%w: %q still held after %d attempts (max wait reached)", ErrNotAcquired, resource, attempts)
	}
	return fmt.Errorf("%w: %q after %d attempts: %w", ErrNotAcquired, resource, attempts, cause)
}

// AcquireOption tunes one Acquire call.
type AcquireOption func(*waitConfig)

type waitConfig struct {
	backoff  Backoff
	maxWait  time.Duration
	attempts *int
}

// MaxWait bounds how long Acquire waits (0: until the context ends).
func MaxWait(d time.Duration) AcquireOption { return func(w *waitConfig) { w.maxWait = d } }

// WithWaitBackoff sets the delays between attempts of this Acquire.
func WithWaitBackoff(b Backoff) AcquireOption { return func(w *waitConfig) { w.backoff = b } }

// CountAttempts stores in *n the number of attempts Acquire made that found
// the lock busy.
func CountAttempts(n *int) AcquireOption { return func(w *waitConfig) { w.attempts = n } }

// Renew extends the lease to its full TTL from now. It returns an error
// matching ErrLockLost when the lock is no longer ours, and never extends a
// lock that holds another token. After a loss or a release it returns at
// once without calling Redis.
func (s *Lease) Renew(ctx context.Context) error {
	if err := s.state.err(); err != nil {
		return err
	}
	if s.locker.rl != nil {
		results := []error{nil}
		s.locker.rl.renew(ctx, []*Lease{s}, []int{0}, results)
		return results[0]
	}
	status, err := run(ctx, s.locker.client, scriptRenew,
		[]string{s.keys.lock, s.keys.owners}, s.token, s.ttl.Milliseconds(), s.reentrantFlag())
	if err != nil {
		return fmt.Errorf("lock: renew %q: %w", s.resource, err)
	}
	return s.settle(status)
}

// Release gives the lock up. It is safe to call more than once: after the
// first release it returns nil at once. It returns an error matching
// ErrLockLost when the lease had already been lost (and then leaves the next
// holder's lock alone).
func (s *Lease) Release(ctx context.Context) error {
	if s.locker.rl != nil {
		return s.locker.rl.release(ctx, s)
	}
	if err := s.state.err(); err != nil {
		if errors.Is(err, errReleased) {
			return nil
		}
		if !inferred(err) {
			return err
		}
		// The loss was inferred locally (deadline, max hold): the key may still
		// hold our token, and deleting it by token frees the resource at once.
		if _, relErr := run(ctx, s.locker.client, scriptRelease,
			[]string{s.keys.lock, s.keys.owners}, s.token, s.owner); relErr != nil {
			return errors.Join(err, fmt.Errorf("lock: release %q: %w", s.resource, relErr))
		}
		return err
	}
	reply, err := run(ctx, s.locker.client, scriptRelease,
		[]string{s.keys.lock, s.keys.owners}, s.token, s.owner)
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", s.resource, err)
	}
	status, _ := reply.(int64)
	if status == 1 || status == 2 {
		s.state.set(errReleased)
		return nil
	}
	return s.settle(reply)
}

// settle turns a renew/release status into the lease's state.
func (s *Lease) settle(reply any) error {
	status, _ := reply.(int64)
	switch status {
	case 1:
		return nil
	case 0:
		return s.state.set(&LostError{Key: s.resource, Reason: ReasonExpired})
	case -1:
		return s.state.set(&LostError{Key: s.resource, Reason: ReasonStolen})
	}
	return fmt.Errorf("lock: %q: unexpected reply %v", s.resource, reply)
}

// inferred reports whether a loss was concluded locally rather than read from Redis.
func inferred(err error) bool {
	var lost *LostError
	return errors.As(err, &lost) && (lost.Reason == ReasonUnreachable || lost.Reason == ReasonMaxHold)
}

// MarkLost records that the lease is lost for reason and returns the state that
// holds (an earlier loss or release wins). Later Renew calls return the loss
// without calling Redis; Release still deletes the key if it holds our token,
// for reasons concluded locally (unreachable, max_hold). The watchdog uses it
// when the local deadline or the max hold passes.
func (s *Lease) MarkLost(reason Reason) error {
	return s.state.set(&LostError{Key: s.resource, Reason: reason})
}

// Lost returns the loss that ended the lease (found by a renewal, a release,
// or concluded locally), or nil if it was not lost. After a release it tells
// whether the lock had been lost before it.
func (s *Lease) Lost() *LostError {
	var lost *LostError
	if errors.As(s.state.err(), &lost) {
		return lost
	}
	return nil
}

// Err returns nil while the lease is believed held, errReleased after a
// release, or the *LostError that ended it.
func (s *Lease) Err() error { return s.state.err() }

func (s *Lease) reentrantFlag() string {
	if s.owner != "" {
		return "1"
	}
	return ""
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
