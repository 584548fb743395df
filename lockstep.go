// Package lockstep locks any code with Redis: a migration, a report, a cache
// rebuild. It is for code that is not a job; job handlers declare their locks
// through package worker, and schedules are changed through package
// schedules.
//
// WithLock takes the lock (at once, or waiting its turn in the resource's
// queue when given Wait), runs a function under a watchdog that renews the
// lease and cancels the function's context the moment the lock is lost, and
// releases the lock when the function returns or panics.
//
//	locker := lockstep.NewLocker(redisClient)
//	defer locker.Close(context.Background())
//	err := locker.WithLock(ctx, "report:daily", func(ctx context.Context, lease *lockstep.Lease) error {
//		return buildReport(ctx, lease.Fence())
//	}, lockstep.TTL(30*time.Second), lockstep.Wait(time.Minute))
//
// The lease's Fence is a fencing token: it strictly increases with every
// acquire of the same key, so a store that remembers the highest fence it
// accepted can refuse a write from a holder whose lock has passed on.
//
// What it guarantees: while the Redis master is healthy, two holders of a key
// never overlap; a holder whose lock is lost sees its context cancelled
// (cause ErrLockLost) before another can take it; waiters are served in
// arrival order, together with the jobs that wait for the same resource; a
// function that returned nil is done, even if its lock turns out lost
// afterwards (Lease.Lost reports it). These are G3 to G6 and G8 of the
// guarantees in the repository's README.
//
// What it does not: a failover with asynchronous replication can lose a
// lock (WaitReplicas narrows the window); then only a store that checks
// fences is protected (package fence checks one in your SQL transaction).
// For strict locks, NewRedlock takes a quorum of independent Redis masters,
// and package github.com/lockstep-dev/lockstep/etcd gives the same Locker
// over etcd. docs/locking.md says how to choose a back end.
package lockstep

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/locklink"
	"github.com/lockstep-dev/lockstep/internal/tracing"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Lease is the lock a WithLock function holds. Renewal and release are the
// Locker's business, not the holder's: a Lease only says which hold this is.
type Lease struct{ l *lock.Lease }

// Key returns the name the lock was taken on, e.g. "report:daily".
func (s *Lease) Key() string { return s.l.Key() }

// Fence returns the fencing token: it strictly increases with every fresh
// acquire of the same key (also across expiry, restarts and failovers), so a
// store that remembers the highest fence that began can refuse a holder
// whose lock has passed on. See "Fencing your own store" in docs/workers.md.
func (s *Lease) Fence() int64 { return s.l.Fence() }

// Permit returns which of the key's permits the lease holds, 0 to n - 1 for
// Permits(n); a lock is permit 0. Fences are per permit: keep the last fence
// per (key, permit) in a fenced store.
func (s *Lease) Permit() int { return s.l.Permit() }

// Token returns the random value that identifies this holder in Redis.
func (s *Lease) Token() string { return s.l.Token() }

// TTL returns the lease's time to live; the watchdog renews it every TTL/3.
func (s *Lease) TTL() time.Duration { return s.l.TTL() }

// Lost returns the loss that ended the lease, or nil. After WithLock
// returned nil it tells whether the lock had been lost meanwhile (fn's work
// is done either way).
func (s *Lease) Lost() *LostError { return s.l.Lost() }

// LostError says which lock was lost and why; errors.Is(err, ErrLockLost)
// holds for it. Its fields are Key (the lock's name) and Reason, one of the
// Reason constants below.
type LostError = lock.LostError

// Reason says why a lock was lost: the label values of
// lockstep_lock_lost_total{reason}.
type Reason = lock.Reason

// The reasons a lock is lost.
const (
	ReasonStolen      = lock.ReasonStolen      // the key holds another holder's token
	ReasonExpired     = lock.ReasonExpired     // the key is gone (deleted, expired, evicted)
	ReasonUnreachable = lock.ReasonUnreachable // Redis did not answer before the local deadline
	ReasonMaxHold     = lock.ReasonMaxHold     // held as long as MaxHold allows
	ReasonStalled     = lock.ReasonStalled     // no Progress for as long as StallAfter allows
	ReasonQuorumLost  = lock.ReasonQuorumLost  // Redlock: fewer than a quorum of nodes kept it
)

var (
	// ErrNotAcquired means the lock is held by someone else (after the wait,
	// if one was asked for).
	ErrNotAcquired = lock.ErrNotAcquired
	// ErrLockLost means the lock was lost while the function ran.
	ErrLockLost = lock.ErrLockLost
)

// WithOwner returns a context whose locks are reentrant for owner: a nested
// WithLock on a key the same owner holds runs at once, and the lock is freed
// when the outermost call returns.
func WithOwner(ctx context.Context, owner string) context.Context {
	return lock.WithOwner(ctx, owner)
}

// Locker takes locks on one back end (a Redis deployment, Redlock's nodes or
// etcd) and renews the ones it holds.
type Locker struct {
	locker   *lock.Locker
	watchdog *watchdog.Watchdog
	trace    *tracing.Tracer // nil: off

	closeBackend func() error // etcd: stops its watch; nil for Redis
}

// Option configures a Locker.
type Option func(*lockerConfig)

type lockerConfig struct {
	lock      []lock.Option
	watchdog  watchdog.Options
	noNotices bool
	tracing   trace.TracerProvider
}

// WithTracerProvider traces every WithLock call with tp, in the caller's
// trace (the span in WithLock's context): a lockstep.lock.wait span for
// taking the lock and a lockstep.lock.hold span for running fn under it, fn's
// context being the hold's. A lost lock is an event on the hold span. The
// span and attribute names are listed in docs/operations.md (Tracing). Without this option
// (or with a nil or no-op tp) WithLock traces nothing.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *lockerConfig) { c.tracing = tp }
}

// WithoutNotices turns off the server notices (Redis client tracking) that
// let the watchdog see a lost lock within milliseconds; losses are then found
// at the next renewal (every TTL/3). For servers that refuse CLIENT TRACKING
// this happens on its own. When the notices run is in docs/design.md
// (section 5, Watchdog).
func WithoutNotices() Option { return func(c *lockerConfig) { c.noNotices = true } }

// KeyPrefix sets the prefix of every Redis key (default "lockstep:"); the
// lock on key K lives at <prefix>{K}.
func KeyPrefix(p string) Option {
	return func(c *lockerConfig) { c.lock = append(c.lock, lock.WithPrefix(p)) }
}

// WaitReplicas makes every acquire wait until n replicas have the lock.
func WaitReplicas(n int, timeout time.Duration) Option {
	return func(c *lockerConfig) { c.lock = append(c.lock, lock.WaitReplicas(n, timeout)) }
}

// DriftMargin sets how long before the lease's expiry, counted from the last
// renewal's send time, an unreachable Redis makes the function's context
// cancel (default TTL/10).
func DriftMargin(d time.Duration) Option {
	return func(c *lockerConfig) { c.watchdog.DriftMargin = d }
}

// NewLocker returns a Locker over client (a single server, Sentinel or
// Cluster client). Close it to stop its watchdog.
//
// Other back ends: NewRedlock (a quorum of independent Redis masters) and
// etcd.NewLocker in package github.com/lockstep-dev/lockstep/etcd.
func NewLocker(client redis.UniversalClient, opts ...Option) *Locker {
	c := configure(opts)
	locker := lock.New(client, c.lock...)
	if !c.noNotices {
		c.watchdog.Notifier = watchdog.Tracking(client, locker.KeyPrefix(), nil)
	}
	return c.locker(locker, nil)
}

// NewRedlock returns a Locker whose locks are held on a majority of nodes,
// independent Redis masters (an odd number, 3 or more: usually 5), as the
// Redlock algorithm does. A lock holds while a quorum keeps it; it has no
// permits (Permits above 1 is refused) and no waiter queue (Wait retries
// with backoff). WaitReplicas does not apply. The clients stay the caller's.
// docs/locking.md says when to choose it.
func NewRedlock(nodes []redis.UniversalClient, opts ...Option) *Locker {
	c := configure(opts)
	return c.locker(lock.NewRedlock(nodes, c.lock...), nil)
}

func init() {
	locklink.New = func(build func([]lock.Option) *lock.Locker, opts any) any {
		c := configure(opts.([]Option))
		l := build(c.lock)
		return c.locker(l, l.Close)
	}
}

func configure(opts []Option) *lockerConfig {
	var c lockerConfig
	for _, o := range opts {
		o(&c)
	}
	return &c
}

func (c *lockerConfig) locker(l *lock.Locker, closeBackend func() error) *Locker {
	return &Locker{locker: l, watchdog: watchdog.New(c.watchdog), trace: tracing.New(c.tracing), closeBackend: closeBackend}
}

// Close stops renewing; functions still running under WithLock see their
// context cancelled. It does not close the Redis (or etcd) clients.
func (l *Locker) Close(ctx context.Context) error {
	err := l.watchdog.Stop(ctx)
	if l.closeBackend != nil {
		err = errors.Join(err, l.closeBackend())
	}
	return err
}

// LockOption tunes one WithLock call.
type LockOption func(*lockCall)

type lockCall struct {
	ttl     time.Duration
	wait    time.Duration
	backoff backoff.Jitter
	maxHold time.Duration
	stall   time.Duration
	limit   int
}

// DefaultTTL is the lease TTL when TTL is not given. The watchdog renews the
// lease every TTL/3, so the TTL bounds how long a crashed holder blocks the
// key, not how long the function may run.
const DefaultTTL = lock.DefaultTTL

// TTL sets the lease's time to live (default DefaultTTL).
func TTL(d time.Duration) LockOption { return func(c *lockCall) { c.ttl = d } }

// Wait makes WithLock wait up to d for a busy lock; without it, a busy lock
// fails at once with ErrNotAcquired. On one Redis deployment waiters are
// served in arrival order, the releasing holder handing the lock to the first
// of them, which wakes holding it; the backoff only bounds each wait, the
// fallback for a wake-up that never comes (a holder that crashed). On Redlock
// and etcd the wait retries with jittered backoff.
func Wait(d time.Duration) LockOption { return func(c *lockCall) { c.wait = d } }

// Backoff sets the delays between attempts while waiting (default 10ms..500ms;
// with fair waiting on Redis, its maximum bounds each wait for a hand-off).
func Backoff(min, max time.Duration) LockOption {
	return func(c *lockCall) { c.backoff = backoff.Jitter{Min: min, Max: max} }
}

// MaxHold bounds how long the lock is kept: past it the function's context is
// cancelled (reason max_hold) and the lock released at once, handed to the
// next waiter.
func MaxHold(d time.Duration) LockOption { return func(c *lockCall) { c.maxHold = d } }

// StallAfter declares that the hold is stalled once the function has called
// Progress for none of d (counted from the acquire until the first call):
// then the lock is no longer renewed but released at once, handed to the
// next waiter, and the function's context is cancelled with ErrLockLost,
// reason stalled. A function stuck in a call that ignores its context (a
// hung driver, a deadlock) so keeps no one waiting, and a store that checks
// fences refuses what it writes when it wakes. Progress, not wall time,
// keeps the hold: a function that reports progress may hold as long as it
// needs (MaxHold bounds that).
func StallAfter(d time.Duration) LockOption { return func(c *lockCall) { c.stall = d } }

// Progress reports that the holder of the hold that ctx belongs to (the
// context WithLock passes to its function, a job handler's context, or one
// derived from them) is making progress: a hold declared with StallAfter
// stalls only after that long without a call. It is one atomic store, never
// a round trip; with a context of no hold it does nothing.
func Progress(ctx context.Context) { watchdog.Progress(ctx) }

// Permits makes key a resource of n permits (a concurrency limit): at most
// n calls hold it at once, each on its own permit (Lease.Permit) with its
// own strictly increasing fence, renewed, lost and handed on (in arrival
// order, with Wait) like a lock. 1 is a lock, the default; n < 1 is an
// error. The limit is the key's: the latest caller's n is the one that
// holds, and a lowered limit cancels no one but admits no one until fewer
// than n hold the key.
func Permits(n int) LockOption { return func(c *lockCall) { c.limit = n } }

// WithLock takes the lock on key, runs fn with a context that is cancelled
// (cause a *LostError, matching ErrLockLost) as soon as the lock is lost, and
// releases the lock when fn returns or panics; a panic is re-raised after the
// release.
//
// It returns ErrNotAcquired if the lock is busy (after the wait). Otherwise
// fn's result decides, as for job handlers (G8 in the README):
//
//   - fn returned nil: WithLock returns nil. fn's work is done, even if the
//     lock turns out lost afterwards (found at release, or while fn ignored
//     its context): running it again would only repeat it. Such a loss is
//     counted in lockstep_lock_lost_total, and lease.Lost() reports it after
//     WithLock returns, for a caller that wants to know.
//   - fn returned an error and the lock was lost: the error matches both
//     ErrLockLost (errors.As gives the *LostError with its Reason) and fn's
//     error, so a caller can tell "failed because the lock was lost" (safe
//     to retry) from a plain failure.
//   - fn returned an error otherwise: that error, as is.
//
// A release that fails for a transport reason is not an error of fn's: the
// lock then expires on its own within its TTL.
func (l *Locker) WithLock(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts ...LockOption) (err error) {
	c := lockCall{ttl: DefaultTTL, backoff: backoff.LockWait, limit: 1}
	for _, o := range opts {
		o(&c)
	}
	var lease *lock.Lease
	ctx, wait := l.trace.StartWait(ctx, key) // tracing: ended by StartHold, or below
	if c.wait > 0 {
		opts := []lock.AcquireOption{lock.MaxWait(c.wait), lock.WithWaitBackoff(c.backoff), lock.Permits(c.limit)}
		var attempts int
		if wait != nil {
			opts = append(opts, lock.CountAttempts(&attempts))
		}
		lease, err = l.locker.Acquire(ctx, key, c.ttl, opts...)
		if attempts > 1 {
			wait.Granted() // it waited: the lock came from the holder before it
		}
	} else {
		lease, err = l.locker.TryAcquire(ctx, key, c.ttl, lock.Permits(c.limit))
	}
	if err != nil {
		wait.Fail(err)
		return err
	}
	var holdOpts []watchdog.HoldOption
	if c.maxHold > 0 {
		holdOpts = append(holdOpts, watchdog.MaxHold(c.maxHold))
	}
	if c.stall > 0 {
		holdOpts = append(holdOpts, watchdog.StallAfter(c.stall))
	}
	ctx, span := l.trace.StartHold(ctx, key, lease.Fence()) // tracing
	if c.limit > 1 || lease.Permit() > 0 {
		span.Permit(lease.Permit())
	}
	hctx, hold := l.watchdog.Hold(ctx, lease, holdOpts...)
	span.Watch(hctx)

	defer func() {
		lost, _ := hold.Finish(ctx)
		span.End(lost, false)
		if r := recover(); r != nil {
			panic(r) // released above; the panic is the caller's to see
		}
		if err != nil && lost != nil && !errors.Is(err, ErrLockLost) {
			err = errors.Join(err, lost)
		}
	}()
	return fn(hctx, &Lease{l: lease})
}
