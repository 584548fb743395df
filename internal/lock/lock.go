package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// Defaults for a Locker.
const (
	DefaultPrefix = "lockstep:"
	// DefaultFenceTTL is how long a fencing counter outlives its lock: the
	// default max_clock_skew, the most that G5 lets Redis servers' clocks
	// differ (see the package documentation, Keys).
	DefaultFenceTTL = 2 * time.Second
	// DefaultTTL is a lease's TTL when none is given: WithLock without TTL,
	// a job type without a Lock TTL, the config's lock.ttl. The watchdog
	// renews every TTL/3, so it bounds how long a crashed holder blocks the
	// lock, not how long the holder may run.
	DefaultTTL = 30 * time.Second
)

// Locker acquires leases on named resources. Its back end is chosen once, by
// the constructor: New for one Redis deployment (a single server, a
// Sentinel-managed master or a Cluster), NewRedlock for a quorum of
// independent masters, NewEtcd for an etcd cluster. Leases, the watchdog and
// everything above them work the same on each.
type Locker struct {
	be      backend
	kind    string // "single", "redlock" or "etcd"
	prefix  string
	backoff backoff.Jitter
	maxWait time.Duration
	metrics *metrics.Metrics

	// acquire results, resolved once: label lookups stay off the hot path
	acquired, busy, failed prometheus.Counter
}

// settings are what Options set; a back end takes the ones that apply to it.
type settings struct {
	prefix      string
	fenceTTL    time.Duration
	replicas    int
	replWait    time.Duration
	backoff     backoff.Jitter
	maxWait     time.Duration
	metrics     *metrics.Metrics
	nodeTimeout time.Duration
	drift       time.Duration
	used        []string // option names, in order, for checkOptions
}

// Option configures a Locker. An Option that does not apply to the Locker's
// back end is rejected by its constructor.
type Option func(*settings)

func option(name string, f func(*settings)) Option {
	return func(s *settings) { s.used = append(s.used, name); f(s) }
}

// WithPrefix sets the prefix of every key (default "lockstep:").
func WithPrefix(p string) Option { return option(optPrefix, func(s *settings) { s.prefix = p }) }

// WithFenceTTL sets how long a fencing counter outlives its lock (default
// DefaultFenceTTL): each acquire and renewal gives the counter the lock's
// ttl plus d. A counter that expired restarts from the server's clock, so
// fences still increase as long as no server's clock is behind another's by
// more than d; configuration refuses a d below the default max_clock_skew.
// Redis back ends only: etcd's fences are revisions, with no counter.
func WithFenceTTL(d time.Duration) Option {
	return option(optFenceTTL, func(s *settings) { s.fenceTTL = d })
}

// WaitReplicas makes every acquire wait until n replicas acknowledged the lock
// (Redis WAIT), within timeout. With fewer acknowledgements the acquire fails
// and releases the lock it had taken. It narrows, but does not close, the
// window in which a failover loses a lock. Only for New: Redlock's nodes are
// masters without replicas, and etcd commits through its quorum anyway.
func WaitReplicas(n int, timeout time.Duration) Option {
	return option(optWaitReplicas, func(s *settings) { s.replicas, s.replWait = n, timeout })
}

// WithBackoff sets the default wait between Acquire attempts (default
// backoff.LockWait).
func WithBackoff(b backoff.Jitter) Option {
	return option(optBackoff, func(s *settings) { s.backoff = b })
}

// WithMaxWait sets how long Acquire waits by default (0: until the context ends).
func WithMaxWait(d time.Duration) Option {
	return option(optMaxWait, func(s *settings) { s.maxWait = d })
}

// WithMetrics records acquire results and latency in m.
func WithMetrics(m *metrics.Metrics) Option {
	return option(optMetrics, func(s *settings) { s.metrics = m })
}

func newSettings(opts []Option) settings {
	s := settings{prefix: DefaultPrefix, fenceTTL: DefaultFenceTTL, backoff: backoff.LockWait}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// newLocker checks the options against the back end and returns the Locker.
func newLocker(kind string, s settings, be backend) (*Locker, error) {
	if err := checkOptions(kind, s.used, be.options()); err != nil {
		return nil, err
	}
	l := &Locker{be: be, kind: kind, prefix: s.prefix, backoff: s.backoff, maxWait: s.maxWait,
		metrics: metrics.OrNop(s.metrics)}
	l.acquired = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireAcquired)
	l.busy = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireBusy)
	l.failed = l.metrics.LockAcquire.WithLabelValues(metrics.AcquireError)
	return l, nil
}

// New returns a Locker over client, one Redis deployment: a single server, a
// Sentinel-managed master or a Cluster (the single back end). It panics when
// an option does not apply to it (WithNodeTimeout, WithClockDrift): a
// programming error, which configuration loading rejects.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	s := newSettings(opts)
	l, err := newLocker("single", s, newSingle(client, s))
	if err != nil {
		panic(err.Error())
	}
	return l
}

// Backend names the Locker's back end: "single", "redlock" or "etcd".
func (l *Locker) Backend() string { return l.kind }

// SharesClient reports whether the locks live in the Redis deployment of the
// client given to New (the single back end): then that Redis's key-change
// notices reach the watchdog. Redlock's nodes and etcd are other stores:
// false. (Whether tasks can wait in a resource's queue is HasQueue.)
func (l *Locker) SharesClient() bool {
	k, ok := l.be.(clientKeeper)
	return ok && k.keepsOnClient()
}

// NotifyLoss registers f to be called, from the back end's own goroutine and
// at once, when the store tells that a held lease's lock was deleted or
// overwritten; the lease is then already marked lost, and err is its
// *LostError (reason stolen or expired). It reports false, and never calls
// f, when the back end has no such notice (the Redis back ends, whose loss
// the watchdog learns at the next renewal). Renewal stays the authority: a
// missed notice delays a loss until then, never hides it. f must not block.
func (l *Locker) NotifyLoss(f func(lease *Lease, err error)) bool {
	n, ok := l.be.(lossNotifier)
	if ok {
		n.notifyLoss(f)
	}
	return ok
}

// Ping checks that a store holding the locks, other than the Redis the
// caller already checks, answers: on etcd a linearizable read (so a member
// cut off from the quorum is not ready); nil on the Redis back ends.
func (l *Locker) Ping(ctx context.Context) error {
	if p, ok := l.be.(interface{ ping(context.Context) error }); ok {
		return p.ping(ctx)
	}
	return nil
}

// Close stops what the back end runs besides leases (etcd: its watch of the
// lock keys). It leaves leases and clients alone. Safe to repeat.
func (l *Locker) Close() error {
	if c, ok := l.be.(interface{ close() error }); ok {
		return c.close()
	}
	return nil
}

// Locker returns the Locker that took the lease.
func (s *Lease) Locker() *Locker { return s.locker }

// Lease is one holder's claim on a resource. Its methods are safe for
// concurrent use.
type Lease struct {
	locker   *Locker
	keys     keys
	resource string
	token    string
	fence    int64
	ttl      time.Duration
	owner    string     // reentrant owner id, "" for a plain lease
	wait     *waitState // the waiting Acquire that takes it; nil for TryAcquire
	reentry  bool       // this lease entered a lock its owner already held
	limit    int        // the limit the acquire declared: 1 for a lock (see Permits)
	sent     time.Time

	state leaseState

	ext any // the back end's own state of this lease, e.g. etcd's lease id

	progress atomic.Pointer[func() time.Time] // the holder's last progress (ReportProgress)
}

// ReportProgress has the lease's renewals on Redis leave the holder's last
// progress, as last says it, beside the lock (until its TTL passes), for
// operators to read (Locks: Held.Progress). The watchdog sets it for a hold
// with StallAfter.
func (s *Lease) ReportProgress(last func() time.Time) { s.progress.Store(&last) }

// progressFlag is the renewal's flag of a lease that reports progress:
// "g:<ms since the last progress>", or "".
func (s *Lease) progressFlag() string {
	last := s.progress.Load()
	if last == nil {
		return ""
	}
	return "g:" + strconv.FormatInt(max(time.Since((*last)()).Milliseconds(), 0), 10)
}

// Key returns the resource name the lease was taken on, e.g. "lock:order:42".
func (s *Lease) Key() string { return s.resource }

// RedisKey returns the key that holds the lock (in etcd, the key's name).
func (s *Lease) RedisKey() string { return s.keys.lock }

// Token returns the token that identifies this holder in the store: random,
// with the holder information ParseToken reads.
func (s *Lease) Token() string { return s.token }

// Fence returns the fencing token: it strictly increases with every fresh
// acquire of the same resource, so a store that remembers the highest fence it
// saw can reject writes from a holder whose lease has since passed to another.
// A reentrant acquire returns the fence of the hold it entered.
func (s *Lease) Fence() int64 { return s.fence }

// TTL returns the lease's time to live, as acquired and as every renewal sets it.
func (s *Lease) TTL() time.Duration { return s.ttl }

// AcquiredAt returns when the acquire request was sent (on etcd, when the
// lease the lock joined was last kept alive, if earlier): the lease is valid
// until at most AcquiredAt + TTL unless renewed.
func (s *Lease) AcquiredAt() time.Time { return s.sent }

// Permit returns which of the resource's permits the lease holds, from 0 to
// the limit - 1; a lock (limit 1) is permit 0. Fences are per permit.
func (s *Lease) Permit() int { return s.keys.permit }

// Reentrant reports whether the lease entered a lock its owner already held.
func (s *Lease) Reentrant() bool { return s.reentry }

// TryAcquire makes one attempt to take the lock on resource for ttl. It
// returns ErrNotAcquired when another holder has it. When ctx carries an owner
// (WithOwner) and that owner already holds the lock, the hold count grows and
// the returned lease shares the holder's token and fence.
//
// Of the options only Permits applies (the others tune waiting).
func (l *Locker) TryAcquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	w := waitConfig{limit: 1}
	for _, o := range opts {
		o(&w)
	}
	return l.tryAcquire(ctx, resource, ttl, nil, w.limit)
}

// tryAcquire is TryAcquire for the waiter of an Acquire ("" for none), which
// a busy lock queues (see wait.go), declaring limit (1: a lock).
func (l *Locker) tryAcquire(ctx context.Context, resource string, ttl time.Duration, wait *waitState, limit int) (*Lease, error) {
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("lock: acquire %q: ttl %v is below 1ms", resource, ttl)
	}
	if err := l.CheckLimit(limit); err != nil {
		return nil, fmt.Errorf("lock: acquire %q: %w", resource, err)
	}
	now := time.Now()
	lease := l.newLease(ctx, resource, ttl, wait, now)
	lease.limit = limit
	ok, err := l.be.acquire(ctx, lease) // a back end may move lease.sent earlier: see AcquiredAt
	l.metrics.LockAcquireDuration.Observe(time.Since(now).Seconds())
	switch {
	case err != nil:
		l.failed.Inc()
		return nil, fmt.Errorf("lock: acquire %q: %w", resource, err)
	case !ok:
		l.busy.Inc()
		return nil, ErrNotAcquired
	}
	l.acquired.Inc()
	return lease, nil
}

func (l *Locker) newLease(ctx context.Context, resource string, ttl time.Duration, wait *waitState, now time.Time) *Lease {
	return &Lease{
		locker:   l,
		keys:     l.keysFor(resource),
		resource: resource,
		token:    tokenFor(ctx, now),
		ttl:      ttl,
		owner:    OwnerFrom(ctx),
		wait:     wait,
		sent:     now,
	}
}

// Acquire waits for the lock on resource until it succeeds, the max wait
// passes (ErrNotAcquired) or ctx ends (an error matching both ErrNotAcquired
// and the context's error). Redis errors end the wait at once.
//
// On one Redis deployment (New) waiters are served in arrival order and
// woken when the holder releases (see wait.go); the decorrelated-jitter
// backoff only bounds each wait, the fallback for a lost wake-up. A waiter
// that gives up leaves the queue. On etcd waiters hold places in the
// resource's queue in etcd, served in their order across processes, each
// woken by a watch on the place just ahead of it (etcd_queue.go); on
// Redlock, and with WaitReplicas, Acquire retries after the delay.
func (l *Locker) Acquire(ctx context.Context, resource string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	w := waitConfig{backoff: l.backoff, maxWait: l.maxWait, limit: 1}
	for _, o := range opts {
		o(&w)
	}
	if err := l.CheckLimit(w.limit); err != nil {
		return nil, fmt.Errorf("lock: acquire %q: %w", resource, err)
	}
	if w.maxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, w.maxWait, errMaxWait)
		defer cancel()
	}
	fw, fair := l.be.(fairWaiter)
	fair = fair && fw.fairWaiting()
	cw, wakes := l.be.(changeWaiter)
	var wait *waitState
	switch {
	case fair, wakes:
		wait = &waitState{id: newToken()[:16]}
	}
	var wk keys // set by the first waitChange, which the Acquire's end undoes
	defer func() {
		if wk.base != "" {
			cw.stopWaiting(wk, wait)
		}
	}()
	giveUp := func() {
		if fair && !wait.sent.IsZero() { // queued
			fw.leave(ctx, l.newLease(ctx, resource, ttl, wait, time.Now()))
		}
	}
	var delay time.Duration
	start := time.Now()
	for attempt := 1; ; attempt++ {
		lease, err := l.tryAcquire(ctx, resource, ttl, wait, w.limit)
		if err == nil && attempt > 1 && w.limit > 1 {
			l.metrics.PermitWait.Observe(time.Since(start).Seconds())
		}
		if !errors.Is(err, ErrNotAcquired) {
			if err != nil {
				giveUp()
				if ctx.Err() != nil {
					return nil, waitEnded(ctx, resource, attempt)
				}
			}
			return lease, err
		}
		if w.attempts != nil {
			*w.attempts = attempt
		}
		delay = w.backoff.Next(delay)
		if fair {
			// Woken by the release that hands the lock over; the backoff's
			// longest delay bounds the wait, the fallback for a lost wake-up.
			lease := l.newLease(ctx, resource, ttl, wait, time.Now())
			lease.limit = w.limit
			ok, err := fw.waitTurn(ctx, lease, max(delay, w.backoff.Max))
			if ok {
				l.acquired.Inc()
				if w.limit > 1 {
					l.metrics.PermitWait.Observe(time.Since(start).Seconds())
				}
				return lease, nil
			}
			if err != nil && ctx.Err() == nil {
				giveUp()
				return nil, fmt.Errorf("lock: acquire %q: %w", resource, err)
			}
		} else if wakes {
			if wk.base == "" {
				wk = l.keysFor(resource)
			}
			// Woken by the change of the key it watches (from its read's
			// revision, so none is missed); the backoff's longest delay
			// bounds the wait, as in the queue on Redis.
			cw.waitChange(ctx, wk, wait, max(delay, w.backoff.Max))
		} else {
			backoff.Sleep(ctx, delay)
		}
		if ctx.Err() != nil {
			giveUp()
			return nil, waitEnded(ctx, resource, attempt)
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
	backoff  backoff.Jitter
	maxWait  time.Duration
	attempts *int
	limit    int
}

// Permits makes the resource one of n permits (a limit): at most n leases
// hold it at once, each on a permit of its own (Lease.Permit) with its own
// strictly increasing fence, renewed, lost and handed on like a lock. 1 is a
// lock (the default). The limit is the resource's: each acquire declares its
// own, and the latest declared is the one that holds (see lua/lib.lua). A
// lowered limit cancels no one; no one gets a permit until fewer than it
// are held. The single and etcd back ends have permits (see CheckLimit).
func Permits(n int) AcquireOption { return func(w *waitConfig) { w.limit = n } }

// CheckLimit reports whether this Locker takes leases of limit n: n ≥ 1, and
// n > 1 only on the single and etcd back ends (Redlock keeps locks alone).
func (l *Locker) CheckLimit(n int) error {
	switch {
	case n < 1:
		return fmt.Errorf("limit %d is below 1 (1 is a lock)", n)
	case n > 1 && l.kind == "redlock":
		return fmt.Errorf("a limit of %d needs permits, which only the single Redis back end and etcd have (this one is %s)", n, l.kind)
	}
	return nil
}

// MaxWait bounds how long Acquire waits (0: until the context ends).
func MaxWait(d time.Duration) AcquireOption { return func(w *waitConfig) { w.maxWait = d } }

// WithWaitBackoff sets the delays between attempts of this Acquire.
func WithWaitBackoff(b backoff.Jitter) AcquireOption { return func(w *waitConfig) { w.backoff = b } }

// CountAttempts stores in *n the number of attempts Acquire made that found
// the lock busy.
func CountAttempts(n *int) AcquireOption { return func(w *waitConfig) { w.attempts = n } }

// Renew extends the lease to its full TTL from now. It returns an error
// matching ErrLockLost when the lock is no longer ours, and never extends a
// lock that holds another token. After a loss or a release it returns at
// once without calling the store.
func (s *Lease) Renew(ctx context.Context) error {
	return s.locker.RenewAll(ctx, []*Lease{s})[0]
}

// Release gives the lock up. It is safe to call more than once: after the
// first release it returns nil at once. It returns an error matching
// ErrLockLost when the lease had already been lost (and then leaves the next
// holder's lock alone).
func (s *Lease) Release(ctx context.Context) error {
	if err := s.state.err(); err != nil {
		if errors.Is(err, errReleased) {
			return nil
		}
		if !inferred(err) {
			return err
		}
		// The loss was inferred locally (deadline, max hold): the key may still
		// hold our token, and deleting it by token frees the resource at once.
		if relErr := s.locker.be.release(ctx, s); relErr != nil && !errors.Is(relErr, ErrLockLost) {
			return errors.Join(err, relErr)
		}
		return err
	}
	err := s.locker.be.release(ctx, s)
	switch {
	case err == nil:
		s.state.set(errReleased)
		return nil
	case errors.Is(err, ErrLockLost):
		return s.state.set(err)
	}
	return err
}

// lost returns the loss of a lease as reason (for a back end to report).
func (s *Lease) lost(reason Reason) error { return &LostError{Key: s.resource, Reason: reason} }

// inferred reports whether a loss was concluded locally rather than read from Redis.
func inferred(err error) bool {
	var lost *LostError
	return errors.As(err, &lost) && (lost.Reason == ReasonUnreachable || lost.Reason == ReasonMaxHold || lost.Reason == ReasonStalled)
}

// MarkLost records that the lease is lost for reason and returns the state that
// holds (an earlier loss or release wins). Later Renew calls return the loss
// without calling Redis; Release still deletes the key if it holds our token,
// for reasons concluded locally (unreachable, max_hold, stalled). The watchdog uses it
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

func (s *Lease) waiterID() string {
	if s.wait == nil {
		return ""
	}
	return s.wait.id
}

func (s *Lease) reentrantFlag() string {
	if s.owner != "" {
		return "1"
	}
	return ""
}

// renewFlags are renew_batch.lua's flags of the lease: "1" reentrant, "p" a
// permit k > 0 (its limit hash is renewed too), "1p" both.
func (s *Lease) renewFlags() string {
	switch {
	case s.keys.permit == 0:
		return s.reentrantFlag()
	case s.owner != "":
		return "1p"
	}
	return "p"
}

// tokenBytes is the random part of a token (128 bits).
const tokenBytes = 16

func newToken() string { return string(appendRandomHex(make([]byte, 0, 2*tokenBytes))) }

// appendRandomHex appends tokenBytes random bytes, in hex, to dst.
func appendRandomHex(dst []byte) []byte {
	var b [tokenBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.AppendEncode(dst, b[:])
}
