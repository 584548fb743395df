package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Job describes the task a handler runs.
type Job struct {
	ID    string // the task's id, unique in its queue
	Type  string // the task type the handler was registered for
	Queue string
	// Attempt is 1 on the first run and grows by one with each failed run
	// (an error, a panic, a lost lock, a crashed worker). Requeues because
	// the lock was busy do not count.
	Attempt int
	// MaxRetry is how many failed runs are retried; after the last one the
	// task is archived.
	MaxRetry int
	// Resource is the lock the handler holds, as declared with Lock; "" when
	// it declared none.
	Resource string
	// Fence is the lock's fencing token: it strictly increases with every
	// acquire of the resource, so a store that keeps the highest fence it
	// accepted can refuse the write of a holder whose lock passed on. Pass it
	// to such a store with every write. 0 without a lock. With a Limit, fences
	// are per permit: keep the highest per (resource, Permit).
	Fence int64
	// Permit is which of the Limit permits the task holds, 0 to n - 1 (0 for
	// a plain lock, and without a lock).
	Permit int
}

// SkipRetry, returned by a handler (or wrapped in its error), archives the
// task at once instead of retrying it: use it for work that cannot succeed.
var SkipRetry = jobs.SkipRetry

// Handler is a task type's handler and its lock, ready for Run or Main.
// Build one with Handle.
type Handler interface {
	spec() (jobs.Spec, error)
}

// HandlerOf is the Handler that Handle returns for payloads of type T. Its
// methods return a copy with one more declaration.
type HandlerOf[T any] struct {
	taskType   string
	fn         func(context.Context, Job, T) error
	resource   func(T) string
	ttl        time.Duration
	contention Contention
	limit      int                                  // Limit's n
	limited    bool                                 // Limit was called (Limit(0) is an error, not the default)
	stall      *time.Duration                       // StallAfter's d, if called
	maxHold    *time.Duration                       // MaxHold's d, if called
	rate       func(T) (string, lockstep.RateLimit) // Rate's or RateBy's
	rateFixed  *lockstep.RateLimit                  // Rate's limit, checked at registration
	fair       func(T) (string, int)                // FairBy's or FairByWeighted's
}

// Handle returns the handler of taskType. The task's payload is JSON,
// decoded into a T; when T (or *T) has a method Validate() error, it is
// called too. A payload that fails either is archived at once, with the
// reason as the task's last error, and fn never sees it.
//
// fn's error retries the task with asynq's backoff, unless it wraps
// SkipRetry. A panic is an error. fn's context ends when the task's deadline
// passes, when the worker shuts down and fn outlives the shutdown timeout,
// and, for a handler with a Lock, when the lock is lost.
func Handle[T any](taskType string, fn func(ctx context.Context, job Job, payload T) error) HandlerOf[T] {
	return HandlerOf[T]{taskType: taskType, fn: fn}
}

// Lock declares the lock fn runs under: resource names it from the payload,
// e.g. func(p Pay) string { return "lock:order:" + p.OrderID }, and ttl is
// the lease's time to live (0: lock.ttl from the configuration).
//
// The worker tries the lock once before fn runs. If another holder has it,
// the task goes back to its queue with jittered backoff that grows while the
// resource stays busy: this is not a failure and does not use the task's
// retries. While fn runs, a watchdog renews the lease every ttl/3; if the
// lease is lost, fn's context is cancelled with a cause matching
// lockstep.ErrLockLost before another holder can take the lock: within
// milliseconds when the key is deleted, overwritten or expires (a server
// notice), at the local deadline when Redis cannot be reached. The lock is
// released when fn returns.
//
// fn's return value decides the task's outcome: nil is done, and the task is
// never run again by Lockstep, even if its lock turns out lost afterwards (the
// loss is counted in lockstep_lock_lost_total and logged with the task id);
// an error is retried, soon and recorded lock_lost when the lock was lost.
//
// The ttl bounds how long a crashed worker keeps the resource locked, not how
// long fn may run.
func (h HandlerOf[T]) Lock(resource func(payload T) string, ttl time.Duration) HandlerOf[T] {
	h.resource, h.ttl = resource, ttl
	return h
}

// Limit lets up to n tasks hold the Lock's resource at once: each holds one of
// its n permits (Job.Permit, 0 to n - 1) with a fencing token of the
// permit's own, renewed, lost and handed on exactly as a lock is (every
// guarantee of a lock holds per permit). Without Limit the lock is one
// permit (n = 1). The contention policy applies when all n are held; a
// release hands its permit to the longest waiter. The limit is the
// resource's: the latest task to take it declares the one that holds, and a
// lowered limit (a deploy from Limit(3) to Limit(2)) cancels no one but
// admits no one until fewer than 2 hold it. n must be at least 1; above 1
// needs a back end with permits, lock.backend redis or etcd (with redlock
// the worker refuses to start, exit 2).
func (h HandlerOf[T]) Limit(n int) HandlerOf[T] {
	h.limit, h.limited = n, true
	return h
}

// StallAfter declares that a run's hold is stalled once its handler has
// called lockstep.Progress (with the handler's context, or one derived from
// it) for none of d, counted from the lock's acquire until the first call.
// A stalled run's lock is no longer renewed but released at once and handed
// to the next waiter (its process is alive: no one waits out a TTL), and
// the handler's context is cancelled with lockstep.ErrLockLost, reason
// stalled. The run counts as failed and is retried as asynq's retry says;
// the next holder's fence is higher, so a store that checks fences refuses
// what the stuck handler writes when it wakes (a goroutine cannot be
// killed). Needs a Lock; d must be positive.
func (h HandlerOf[T]) StallAfter(d time.Duration) HandlerOf[T] {
	h.stall = &d
	return h
}

// MaxHold bounds how long a run may hold its lock, as lockstep.MaxHold does
// for WithLock: past d the run's context is cancelled with
// lockstep.ErrLockLost, reason max_hold, and the lock released at once and
// handed to the next waiter. Needs a Lock; d must be positive.
func (h HandlerOf[T]) MaxHold(d time.Duration) HandlerOf[T] {
	h.maxHold = &d
	return h
}

// Rate limits the task type per key: key names it from the payload (e.g.
// func(p Sync) string { return "rate:partner:" + p.PartnerID }), and over
// any window of w at most r.N·w/r.Per + r.Burst tasks of one key start
// (Burst 0 is N), across every worker and process (G11 in the README's
// guarantees). The limit is decided before fn runs: a task over its rate is
// delayed to the moment its key admits one, never failed and never counted
// as an attempt (its retry count stays), and no worker waits meanwhile.
// With a Lock (or Limit), one admission decides both, in one script when
// the lock is taken: the rate is asked only when the lock would be given
// to the task, so a wait for the lock spends no turn and every start
// follows its admission at once (on the single Redis back end with the
// default Requeue policy; elsewhere the rate is asked first, then the lock:
// docs/workers.md). A task with no retries left waits in the worker
// instead (asynq would archive it). Its key lives in the queue's Redis,
// whatever lock.backend is. Delays count in lockstep_rate_limited_total and
// lockstep_rate_limit_delay_seconds. An empty key is an invalid payload.
func (h HandlerOf[T]) Rate(key func(payload T) string, r lockstep.RateLimit) HandlerOf[T] {
	h.rate = func(p T) (string, lockstep.RateLimit) { return key(p), r }
	h.rateFixed = &r
	return h
}

// RateBy is Rate with the limit taken from the payload too, e.g. a premium
// tenant's higher rate: f returns the key and its limit. Tasks of one key
// should agree on its limit; while they differ, each admission is decided by
// the limit of the task that asks. A limit that is not one (N < 1, Per ≤ 0,
// Burst < 0) is an invalid payload.
func (h HandlerOf[T]) RateBy(f func(payload T) (key string, r lockstep.RateLimit)) HandlerOf[T] {
	h.rate, h.rateFixed = f, nil
	return h
}

// FairBy shares the workers fairly among tenants: tenant names a task's
// tenant from the payload (e.g. func(p Sync) string { return p.TenantID }),
// and the tasks of the type in one queue start in turns across the tenants
// that have tasks waiting, each getting an equal share of the starts
// whatever order the tasks were enqueued in: a tenant's burst of 10,000
// tasks no longer makes every other tenant wait behind it. Within a tenant,
// tasks start in the order they were enqueued. It works on tasks enqueued
// with asynq's own client, across every worker and process, and is decided
// before the handler's Rate, its Lock and fn: a task whose tenant has had
// its share waits in asynq's retry set, never failed and never counted as
// an attempt, and no worker slot waits meanwhile. A tenant with nothing
// waiting saves up no credit. A task with no retries left, or run as a
// schedule's run, starts at once. An empty tenant is an invalid payload.
// The turns live in the queue's Redis, whatever lock.backend is; see
// lockstep fair for each tenant's backlog and share.
func (h HandlerOf[T]) FairBy(tenant func(payload T) string) HandlerOf[T] {
	h.fair = func(p T) (string, int) { return tenant(p), 1 }
	return h
}

// FairByWeighted is FairBy with a weight per tenant, from the payload: a
// tenant of weight w gets w / (the sum of the weights of the tenants with
// tasks waiting) of the starts, e.g. a premium tenant of weight 2 twice a
// standard one's. Tasks of one tenant should agree on its weight; while
// they differ, each task counts by its own. A weight outside 1 to 1000 is an
// invalid payload.
func (h HandlerOf[T]) FairByWeighted(f func(payload T) (tenant string, weight int)) HandlerOf[T] {
	h.fair = f
	return h
}

// Contention is what a task does when its lock is busy: Requeue (the
// default), Skip or Wait. Set it with OnContention.
type Contention struct {
	policy jobs.Contention
	wait   time.Duration
}

// Requeue puts the task back in its queue: the next release of the lock
// offers it again at once, and jittered backoff (worker.contention_backoff_min
// to _max, growing with each contention and with the tasks waiting ahead)
// brings it back if no release does. It is no failure and uses none of the
// task's retries, and no worker waits meanwhile. It is the default, and the
// right policy for work that must run and may wait its turn: payments,
// per-account updates, long critical sections.
func Requeue() Contention { return Contention{policy: jobs.Requeue} }

// Skip completes the task without running the handler when the lock is busy:
// the task is a duplicate of the work already running (a cache rebuild, a
// sync of the same account, a report for the same day). The skip counts in
// lockstep_jobs_processed_total{result="skipped"} and is the task's result.
// It never runs two handlers at once and never cuts the running one short.
// Do not use it for tasks whose payloads differ in what they do: a second
// payment of the same order is not a duplicate.
func Skip() Contention { return Contention{policy: jobs.Skip} }

// Wait waits in the worker up to max for the lock, retrying with the
// contention backoff, and requeues the task if the lock is still busy then.
// It suits short critical sections, where holding a worker slot for a
// moment costs less than a requeue's latency (asynq retries with
// one-second resolution).
func Wait(max time.Duration) Contention { return Contention{policy: jobs.Wait, wait: max} }

// OnContention sets what the task does when its lock is busy (default
// Requeue). It matters only with a Lock.
func (h HandlerOf[T]) OnContention(c Contention) HandlerOf[T] {
	h.contention = c
	return h
}

// validator is what a payload type may implement to check itself.
type validator interface{ Validate() error }

// DemoJob registers Lockstep's built-in demo jobs (see docs/workers.md):
// demo:order.pay pays an order under the order's lock with a fenced store and
// records every execution; demo:tenant.sync syncs a tenant under its
// resource of 3 permits (on the redis and etcd back ends: Redlock has no
// permits), fenced per (tenant, permit). The cmd/worker binary and `make run` register it;
// a worker of your own registers it only with DemoJob or with worker.demo:
// true in its configuration.
func DemoJob() Handler { return demoJob{} }

// WithTracerProvider makes the worker trace with tp instead of the provider
// the standard OTEL_* variables configure: every run of a task is a
// lockstep.job span (a child of the trace context its enqueue put in the
// task's headers), with lockstep.lock.wait and lockstep.lock.hold spans for
// its lock; a handler's context carries the hold's span (or the job's, for a
// task without a lock). The program keeps tp and shuts it down. It is passed
// among the handlers of Main or Run.
func WithTracerProvider(tp trace.TracerProvider) Handler { return tracerProvider{tp} }

// tracerProvider is WithTracerProvider's marker.
type tracerProvider struct{ tp trace.TracerProvider }

func (tracerProvider) spec() (jobs.Spec, error) {
	return jobs.Spec{}, errors.New("worker: a tracer provider is not a handler")
}

// Runtime is what a worker built from its configuration lends to the
// program's own code (OnStart): handlers reach the worker's Redis client,
// logger and configuration through it instead of reading the environment
// again.
type Runtime struct {
	// Redis is the worker's client of the redis section (the one asynq and
	// the locks use); the worker closes it after its handlers returned.
	Redis redis.UniversalClient
	// Log is the worker's JSON logger (log.level, log.format).
	Log *slog.Logger
	// Lookup reads the variables the worker read its LOCKSTEP_* from (the
	// process's, or Env.LookupEnv).
	Lookup func(string) (string, bool)
	// Queues are the queues the worker takes tasks from, with their
	// priorities (worker.queues).
	Queues map[string]int
	// LockPrefix is lock.prefix, the start of every lock key.
	LockPrefix string
}

// OnStart runs f once the worker has its configuration and its Redis client,
// before it takes any task; an error from f stops the worker from starting
// (Run returns it; Main exits 1). It is how handlers get what the worker
// built, e.g. a client to enqueue follow-up tasks with:
//
//	var rt worker.Runtime
//	worker.Main(worker.OnStart(func(_ context.Context, r worker.Runtime) error { rt = r; return nil }),
//		worker.Handle("order:pay", pay))
//
// Pass it among the handlers, as often as needed; each runs in order.
func OnStart(f func(ctx context.Context, rt Runtime) error) Handler { return onStart{f} }

// onStart is OnStart's marker.
type onStart struct {
	f func(context.Context, Runtime) error
}

func (onStart) spec() (jobs.Spec, error) {
	return jobs.Spec{}, errors.New("worker: OnStart is not a handler")
}

// demoJob is DemoJob's marker: the demo's spec needs the worker's Redis
// client and id, so the app builds it.
type demoJob struct{}

func (demoJob) spec() (jobs.Spec, error) {
	return jobs.Spec{}, errors.New("worker: the demo job is built by the app")
}

func (h HandlerOf[T]) spec() (jobs.Spec, error) {
	switch {
	case h.fn == nil:
		return jobs.Spec{}, fmt.Errorf("worker: handler for %q is nil", h.taskType)
	case h.ttl < 0:
		return jobs.Spec{}, fmt.Errorf("worker: handler for %q: negative lock ttl %v", h.taskType, h.ttl)
	case h.limited && h.limit < 1:
		return jobs.Spec{}, fmt.Errorf("worker: handler for %q: Limit(%d): the limit must be at least 1", h.taskType, h.limit)
	case h.limited && h.resource == nil:
		return jobs.Spec{}, fmt.Errorf("worker: handler for %q: Limit needs a Lock", h.taskType)
	case h.contention.policy == jobs.Wait && h.contention.wait <= 0:
		return jobs.Spec{}, fmt.Errorf("worker: handler for %q: Wait needs a positive bound, got %v", h.taskType, h.contention.wait)
	}
	for _, b := range []struct {
		name string
		d    *time.Duration
	}{{"StallAfter", h.stall}, {"MaxHold", h.maxHold}} {
		switch {
		case b.d == nil:
		case *b.d <= 0:
			return jobs.Spec{}, fmt.Errorf("worker: handler for %q: %s needs a positive duration, got %v", h.taskType, b.name, *b.d)
		case h.resource == nil:
			return jobs.Spec{}, fmt.Errorf("worker: handler for %q: %s needs a Lock", h.taskType, b.name)
		}
	}
	if h.rateFixed != nil {
		if err := lock.Rate(*h.rateFixed).Check(); err != nil {
			return jobs.Spec{}, fmt.Errorf("worker: handler for %q: Rate: %w", h.taskType, err)
		}
	}
	s := jobs.Spec{
		Type:           h.taskType,
		TTL:            h.ttl,
		Limit:          max(h.limit, 1),
		Contention:     h.contention.policy,
		ContentionWait: h.contention.wait,
		StallAfter:     deref(h.stall),
		MaxHold:        deref(h.maxHold),
		Decode: func(b []byte) (any, error) {
			var p T
			if err := json.Unmarshal(b, &p); err != nil {
				return nil, err
			}
			if v, ok := any(p).(validator); ok {
				return p, v.Validate()
			}
			if v, ok := any(&p).(validator); ok {
				return p, v.Validate()
			}
			return p, nil
		},
		Run: func(ctx context.Context, j jobs.Job, p any) error {
			return h.fn(ctx, Job{ID: j.ID, Type: j.Type, Queue: j.Queue, Attempt: j.Attempt, MaxRetry: j.MaxRetry,
				Resource: j.Resource, Fence: j.Fence, Permit: j.Permit}, p.(T))
		},
	}
	if h.rate != nil {
		rate := h.rate
		s.Rate = func(p any) (string, lock.Rate) {
			key, r := rate(p.(T))
			return key, lock.Rate(r)
		}
	}
	if h.fair != nil {
		fair := h.fair
		s.Fair = func(p any) (string, int) { return fair(p.(T)) }
	}
	if h.resource != nil {
		resource := h.resource
		s.Resource = func(p any) string { return resource(p.(T)) }
	}
	return s, nil
}

// specs converts handlers, reporting every problem at once.
func specs(handlers []Handler) ([]jobs.Spec, error) {
	out := make([]jobs.Spec, 0, len(handlers))
	var errs []error
	for i, h := range handlers {
		if h == nil {
			errs = append(errs, fmt.Errorf("worker: handler %d is nil", i))
			continue
		}
		s, err := h.spec()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, s)
	}
	return out, errors.Join(errs...)
}

func deref(d *time.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return *d
}
