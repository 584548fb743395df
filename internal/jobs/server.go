package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/tracing"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Label values of lockstep_jobs_processed_total{result}. A requeue because of
// contention is not a processed job: it counts in lockstep_job_contended_total.
const (
	ResultSuccess  = "success"   // the handler returned nil (done, even if its lock was lost meanwhile)
	ResultFailure  = "failure"   // the handler returned an error or panicked
	ResultLockLost = "lock_lost" // the handler failed and its lock was lost while it ran
	ResultInvalid  = "invalid"   // the payload did not decode; archived without running
	ResultSkipped  = "skipped"   // the lock was busy and the contention policy is Skip
)

// DefaultConcurrency is Config.Concurrency's default.
const DefaultConcurrency = 10

// Config configures a Server. Zero values take the defaults.
type Config struct {
	Queues          map[string]int // queue name -> priority; default {"default": 1}
	StrictPriority  bool
	Concurrency     int           // handlers running at once; default 10
	ShutdownTimeout time.Duration // all of Stop: handlers finish, leases are released; 0: no grace
	LockTTL         time.Duration // for specs without a TTL; default lock.DefaultTTL
	// Backoff is the fallback delay of a task whose lock was busy, should
	// no hand-off reach it first (added to the lock's remaining TTL, more
	// for the waiters behind the first), and the retry delay after a lost
	// lock: decorrelated jitter from Min, capped at Max. Default backoff.Requeue.
	Backoff backoff.Jitter
	// PollInterval is how often an idle worker looks for tasks (asynq sleeps
	// 0.5 to 1.5 of it after finding every queue empty) and how often due
	// retries are moved back to their queues; a hand-off never waits for
	// it. Default Backoff.Min within [20ms, 1s]; asynq's own defaults are 1s
	// and 5s.
	PollInterval time.Duration
}

// withDefaults is c with its zero values replaced by the defaults.
func (c Config) withDefaults() Config {
	if len(c.Queues) == 0 {
		c.Queues = map[string]int{"default": 1}
	}
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.LockTTL = cmp.Or(c.LockTTL, lock.DefaultTTL)
	if c.Backoff.Min <= 0 {
		c.Backoff = backoff.Requeue
	}
	c.PollInterval = cmp.Or(c.PollInterval, min(max(c.Backoff.Min, 20*time.Millisecond), time.Second))
	return c
}

// Params are what a Server needs; fx fills them in Module.
type Params struct {
	fx.In
	Client   redis.UniversalClient // shared with asynq; set ContextTimeoutEnabled
	Locker   *lock.Locker
	Watchdog *watchdog.Watchdog
	Registry *Registry
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	Config   Config
	// Tracing traces every run (tracing.go); nil or no-op: off.
	Tracing trace.TracerProvider `optional:"true"`
}

// processName names this process in recovery and in its losses: the
// holder in its lock tokens. A test swaps it to run a second server as
// another process (addWorkerWith).
var processName = procid.Self

// Server runs registered handlers for tasks from asynq, each under its
// declared lock; see the package documentation for the flow.
type Server struct {
	client   redis.UniversalClient
	locker   *lock.Locker
	watchdog *watchdog.Watchdog
	registry *Registry
	metrics  *metrics.Metrics
	log      *slog.Logger
	trace    *tracing.Tracer // nil: off
	cfg      Config
	srv      *asynq.Server
	store    *asynqstore.Store // asynq's tasks, for the hand-off
	handsOff bool              // tasks park in the resource's queue and releases hand on to them
	recovers bool              // a dead worker's locked tasks are brought back once their locks expire (recovery.go)
	grants   context.CancelFunc
	bgCtx    context.Context // the started server's, cancelled with grants; nil before Start
	bg       sync.WaitGroup  // wakes of granted tasks still on their way to the retry set; recovery
	recovery *recovery       // nil: no recovery (an asynq whose layout asynqstore does not know)
	proc     *lock.Registry  // this process's records and lost locks, on the queue's Redis (recovery's too)

	hooks hooks // zero outside tests

	// fairSeen: the tasks this server showed a fair decision lately, by
	// queue and id (fair.go).
	fairMu   sync.Mutex
	fairSeen map[string]time.Time

	// runLock holds schedules' run locks when locker is no single Redis.
	runOnce sync.Once
	runLock *lock.Locker

	life     lifecycle.Machine
	mu       sync.Mutex
	holds    map[*watchdog.Hold]struct{}
	inflight int           // ProcessTask calls and detached chains running; guarded by mu
	idle     chan struct{} // closed when inflight drops to 0; guarded by mu
	stopping chan struct{} // closed when Stop begins
	giveUp   time.Time     // when Stop gives up on running handlers (asynq's share of the grace); set before stopping closes
}

// NewServer returns a server; it touches Redis only once started.
func NewServer(p Params) *Server {
	c := p.Config.withDefaults()
	s := &Server{
		client:   p.Client,
		locker:   p.Locker,
		watchdog: p.Watchdog,
		registry: p.Registry,
		metrics:  metrics.OrNop(p.Metrics),
		log:      cmp.Or(p.Logger, slog.New(slog.DiscardHandler)),
		trace:    tracing.New(p.Tracing),
		cfg:      c,
		holds:    map[*watchdog.Hold]struct{}{},
		stopping: make(chan struct{}),
		store:    asynqstore.New(p.Client),
		grants:   func() {},
		proc:     p.Locker.Registry(p.Client, processName()), // the holder in this process's lock tokens
	}
	s.recovery = newRecovery(s.proc)
	linked, known := linkedAsynq()
	s.handsOff, s.recovers = s.locker.HasQueue() && known, known
	if !known {
		s.recovery = nil
		s.log.Warn("hand-off and recovery off: this worker is linked against an asynq whose task layout asynqstore does not know; contended tasks are requeued with backoff, a dead worker's tasks come back with asynq's lease",
			"asynq", linked, "known", asynqstore.Version)
	}
	// Every series at zero from the start, so the first event shows in rate().
	if p.Registry != nil {
		for _, t := range p.Registry.Types() {
			s.metrics.JobContended.WithLabelValues(t)
			s.metrics.JobsRecovered.WithLabelValues(t)
			s.metrics.RateLimited.WithLabelValues(t)
			s.metrics.FairWaits.WithLabelValues(t)
			for _, r := range []string{ResultSuccess, ResultFailure, ResultLockLost, ResultInvalid, ResultSkipped} {
				s.metrics.JobsProcessed.WithLabelValues(t, r)
			}
		}
	}
	asynqClient := p.Client
	if _, cluster := p.Client.(*redis.ClusterClient); s.recovery != nil && !cluster {
		// Every task is recorded for a recoverer as asynq hands it over
		// (recovery.go), and its worker noted in it.
		asynqClient = asynqstore.RecordDequeues(p.Client, s.recovery.reg.Holds(), s.recovery.reg.Process(), func(queue, id string) string { return lock.HoldRecord("", queue, id) })
		s.recovery.dequeues = true
	} else if s.recovery != nil {
		// On a Cluster the holds set lies in another slot: the dequeue
		// only notes the worker in the task.
		asynqClient = asynqstore.RecordDequeues(p.Client, "", s.recovery.reg.Process(), nil)
	}
	s.srv = asynq.NewServerFromRedisClient(asynqClient, asynq.Config{
		Concurrency:              c.Concurrency,
		Queues:                   c.Queues,
		StrictPriority:           c.StrictPriority,
		ShutdownTimeout:          asynqShutdownTimeout(c.ShutdownTimeout),
		RetryDelayFunc:           retryDelay(c.Backoff),
		IsFailure:                isFailure,
		TaskCheckInterval:        c.PollInterval,
		DelayedTaskCheckInterval: c.PollInterval,
		Logger:                   asynqLogger{s.log.With("component", "asynq")},
		LogLevel:                 asynqLevel(s.log),
	})
	return s
}

// hooks let tests and benchmarks observe the server; only they set them.
type hooks struct {
	// wait sees every task that joins a resource's waiters, with its
	// arrival (Unix ms).
	wait func(job Job, since float64)
}

// linkedAsynq reports the asynq version this binary is linked against and
// whether asynqstore knows its layout (a variable: tests pretend another).
var linkedAsynq = asynqstore.Supported

// asynqShutdownTimeout is the part of the shutdown budget that asynq waits for
// running handlers; the rest (a fifth, at most a second) is left for handlers
// that asynq gave up on to return and release their locks.
func asynqShutdownTimeout(total time.Duration) time.Duration {
	d := total - min(total/5, time.Second)
	return max(d, time.Nanosecond) // asynq reads 0 as its 8s default
}

// Start starts taking tasks. Like every background service it follows
// internal/lifecycle: it returns at once, a repeated Start does nothing, a
// Start after Stop fails.
func (s *Server) Start(context.Context) error {
	return s.life.Start(func() error {
		ctx, cancel := context.WithCancel(context.Background())
		s.grants, s.bgCtx = cancel, ctx
		if s.handsOff {
			if err := s.watchGrants(ctx); err != nil {
				cancel()
				return fmt.Errorf("jobs: start: %w", err)
			}
		}
		if s.recovers {
			s.bg.Go(func() { s.runRecovery(ctx) })
			s.bg.Go(func() { s.fairKick(ctx) })
		}
		if err := s.srv.Start(s.handler()); err != nil {
			s.grants()
			return fmt.Errorf("jobs: start: %w", err)
		}
		s.log.Info("worker started", "queues", s.cfg.Queues, "concurrency", s.cfg.Concurrency, "types", s.registry.Len())
		return nil
	})
}

// Stop stops taking tasks and lets running handlers finish within the shutdown
// timeout. asynq then puts the tasks of handlers still running back in their
// queues and cancels their contexts; Stop waits for those handlers to return
// and release their locks, and releases any lock still held. Like every
// background service it follows internal/lifecycle: it is safe before Start
// and to repeat, and a Stop that finds another under way waits for it, bounded
// by its own ctx.
func (s *Server) Stop(ctx context.Context) error { return s.life.Stop(ctx, s.stop) }

func (s *Server) stop(ctx context.Context) error {
	begin := time.Now()
	deadline := begin.Add(s.cfg.ShutdownTimeout)
	s.log.Info("worker stopping: no new tasks; waiting for running handlers", "timeout", s.cfg.ShutdownTimeout)
	s.mu.Lock()
	s.giveUp = begin.Add(asynqShutdownTimeout(s.cfg.ShutdownTimeout))
	s.mu.Unlock()
	close(s.stopping) // chains hand their delivered task's result to asynq now (followChain)

	shutdown := make(chan struct{})
	go func() { s.srv.Shutdown(); close(shutdown) }()
	select {
	case <-shutdown:
	case <-ctx.Done():
		s.releaseAll()
		s.grants()
		return fmt.Errorf("jobs: stop: %w", ctx.Err())
	}

	grace := time.NewTimer(max(time.Until(deadline), 0))
	defer grace.Stop()
	select {
	case <-s.whenIdle():
	case <-grace.C:
	case <-ctx.Done():
	}
	n := s.releaseAll()
	s.grants()
	s.bg.Wait()
	s.leaveRecovery()
	if n > 0 {
		s.log.Warn("worker stopped with handlers still running; released their locks", "locks", n)
	} else {
		s.log.Info("worker stopped")
	}
	return nil
}

// releaseAll ends every hold still open and releases its lease; it returns
// how many there were.
func (s *Server) releaseAll() int {
	s.mu.Lock()
	holds := make([]*watchdog.Hold, 0, len(s.holds))
	for h := range s.holds {
		holds = append(holds, h)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range holds {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := h.Finish(ctx); err != nil {
				s.log.Warn("release at shutdown failed; the lock expires within its TTL",
					"resource", h.Lease().Key(), "err", err)
			}
		})
	}
	wg.Wait()
	return len(holds)
}

// Ready reports whether the server is taking tasks.
func (s *Server) Ready(context.Context) error {
	if p := s.life.Phase(); p != lifecycle.Running {
		return errors.New(p.String())
	}
	return nil
}

// ProcessTask is the lock middleware around every handler (asynq.Handler).
func (s *Server) ProcessTask(ctx context.Context, t *asynq.Task) error {
	s.enter()
	defer s.leave()
	if err := ctx.Err(); err != nil {
		// asynq starts a handler in a goroutine of its own, which may run
		// only after asynq gave up on the task at shutdown and requeued it.
		return err
	}
	if s.recovery != nil && s.recovery.dequeues {
		// asynq's dequeue wrote the task's bare record (recovery.go).
		// A schedule's run keeps it while it waits for its run lock
		// (processRun drops it once the lock is taken): a run that never
		// began is brought back if its worker dies; one that began is not
		// recovered (holdsFor).
		if t.Headers()[overlap.HeaderSchedule] == "" {
			job := jobOf(ctx, t.Type())
			s.recovery.back("", job.Queue, job.ID)
			defer s.recovery.left("", job.Queue, job.ID)
		}
	}
	var err error
	if schedule := t.Headers()[overlap.HeaderSchedule]; schedule != "" {
		err = s.processRun(ctx, t, schedule) // under the schedule's run lock (runs.go)
	} else {
		err = s.process(ctx, t)
	}
	if soon := (*soonError)(nil); errors.As(err, &soon) && ctx.Err() == nil {
		// The lock's back end (or the queue's Redis) failed before the
		// handler ran: asynq logs nothing of a retried task's error.
		s.log.Warn(soon.step+" failed; task retried soon", "type", t.Type(), "id", jobOf(ctx, t.Type()).ID, "err", soon.err)
	}
	return err
}

// process runs one task under its handler's lock.
func (s *Server) process(ctx context.Context, t *asynq.Task) error {
	spec, ok := s.registry.Lookup(t.Type())
	if !ok {
		return fmt.Errorf("jobs: no handler for task type %q on this worker", t.Type())
	}
	spec = runSpec(ctx, spec)
	job := jobOf(ctx, t.Type())
	payload, err := spec.Decode(t.Payload())
	if err != nil {
		return s.invalid(job, err)
	}
	if spec.Fair != nil && s.recovers {
		counted, err := s.fairTurn(ctx, spec, job, payload)
		if err != nil {
			return err // waits for its turn (no failure), or its result
		}
		if counted {
			defer s.fairDone(ctx, spec.Type, job.Queue, job.ID)
		}
	}
	var rate *lock.TaskRate // decided with the lock (one admission), else asked first
	if spec.Rate != nil {
		if rate = s.taskRate(spec, job, payload, ctx.Value(inRunKey{}) != nil); rate != nil {
			job.turn = rate.Rate.Interval()
		}
	}
	if spec.Rate != nil && rate == nil {
		if err := s.admit(ctx, spec, &job, payload); err != nil {
			return err // delayed to its turn (no failure), or its result
		}
	}
	if spec.Resource == nil {
		if s.holdBare(ctx, job) {
			defer s.recovery.left("", job.Queue, job.ID)
		}
		return s.run(ctx, spec, job, payload, nil, nil)
	}
	if job.Resource = spec.Resource(payload); job.Resource == "" {
		return s.invalid(job, errors.New("the lock's resource name is empty"))
	}
	ttl := cmp.Or(spec.TTL, s.cfg.LockTTL)
	job.limit = max(spec.Limit, 1)
	ctx = lock.WithJob(ctx, job.ID, job.Type)     // the lock's value names the job, for `lockstep locks`
	ctx, _ = s.trace.StartWait(ctx, job.Resource) // tracing: ended by the hold, or by the job's end
	if !s.handsOff {
		// Redlock and etcd keep the locks away from the queue's Redis: the
		// hand-off (one script over the lock and the queue) cannot span
		// them, so those back ends (and a worker linked against an asynq
		// whose layout asynqstore does not know) take the lock through the
		// Locker.
		return s.serveThroughLocker(ctx, t, spec, job, payload, ttl)
	}
	// A task that waits in its worker (Wait, or no retries left to requeue
	// with) waits as a goroutine waiter of the queue: its first take does
	// not park it.
	r, err := s.take(ctx, job, ttl, spec.Contention == Requeue && job.Attempt <= job.MaxRetry, rate)
	switch {
	case err != nil:
		return soon(stepLock, job, err)
	case r.Done:
		return s.replay(job, r.Outcome)
	case r.RateWait > 0:
		return s.rateDelayed(job, rate.Key, r.RateWait) // the lock granted to it until its turn
	case r.Granted:
		s.trace.WaitGranted(ctx) // tracing
	case r.Lease == nil:
		s.metrics.JobContended.WithLabelValues(job.Type).Inc()
		s.trace.WaitBusy(ctx, r.Ahead) // tracing
		if r.Lease, err = s.contended(ctx, t, spec, job, ttl, r); r.Lease == nil {
			return err
		}
		s.trace.WaitGranted(ctx) // tracing: a waiter's lock comes from the release before it
	}
	if rate != nil {
		s.admitted(ctx, &job, rate.Key, r.Admitted) // by the take, with its lock
	}
	return s.serve(ctx, spec, job, payload, r.Lease)
}

// serve runs job under lease, then, in this same slot, every task the lock
// is handed on to (chain.go).
func (s *Server) serve(ctx context.Context, spec *Spec, job Job, payload any, lease *lock.Lease) error {
	h := &handoff{}
	err := s.run(ctx, spec, job, payload, lease, h)
	keep := h.marker
	if h.next != nil {
		s.followChain(ctx, h.next, h.from, keep)
	}
	s.recovery.left(job.Resource, job.Queue, job.ID) // asynq records it as this returns
	if keep != "" {
		s.recovery.forget(keep, job.Queue, job.ID) // once no delivery of it is left to read its marker
	}
	return err
}

// serveThroughLocker runs job under a lock taken through the Locker's back
// end (Redlock, etcd): a busy lock is skipped, waited for (Wait) or
// requeued with the backoff, and a release wakes no one (waiters come back
// at their backoff).
func (s *Server) serveThroughLocker(ctx context.Context, t *asynq.Task, spec *Spec, job Job, payload any, ttl time.Duration) error {
	if out, ok := s.ranBefore(ctx, job); ok {
		return s.replay(job, out)
	}
	lease, err := s.locker.TryAcquire(ctx, job.Resource, ttl, lock.Permits(job.limit))
	bare := false // this server wrote the task's bare record: it waits in this worker
	defer func() {
		if bare {
			s.recovery.left("", job.Queue, job.ID)
		}
	}()
	wait := func(opts ...lock.AcquireOption) (*lock.Lease, error) {
		bare = bare || s.holdBare(ctx, job)
		return s.locker.Acquire(ctx, job.Resource, ttl, append(opts, lock.WithWaitBackoff(s.cfg.Backoff), lock.Permits(job.limit))...)
	}
	if errors.Is(err, lock.ErrNotAcquired) {
		s.metrics.JobContended.WithLabelValues(job.Type).Inc()
		switch spec.Contention {
		case Skip:
			s.metrics.JobsProcessed.WithLabelValues(job.Type, ResultSkipped).Inc()
			if w := t.ResultWriter(); w != nil {
				_, _ = w.Write([]byte(ResultSkipped))
			}
			return nil
		case Wait:
			lease, err = wait(lock.MaxWait(spec.ContentionWait))
		}
		if errors.Is(err, lock.ErrNotAcquired) && ctx.Err() == nil {
			if job.Attempt > job.MaxRetry {
				// No retries left to requeue with: wait for the lock.
				lease, err = wait()
			} else {
				return &ContendedError{Resource: job.Resource, Delay: s.cfg.Backoff.Nth(job.Attempt)}
			}
		}
	}
	if err != nil {
		return soon(stepLock, job, err)
	}
	return s.runRecoverable(ctx, spec, job, payload, lease)
}

func (s *Server) invalid(job Job, err error) error {
	s.metrics.JobsProcessed.WithLabelValues(job.Type, ResultInvalid).Inc()
	s.log.Warn("invalid payload; task archived", "type", job.Type, "id", job.ID, "err", err)
	return fmt.Errorf("invalid payload for %s: %v: %w", job.Type, err, SkipRetry)
}

// contended applies the spec's contention policy to a busy lock (take.lua
// has put the task among the waiters, unless it skips). It returns a lease
// to run with, or the task's result.
func (s *Server) contended(ctx context.Context, t *asynq.Task, spec *Spec, job Job, ttl time.Duration, r lock.Taken) (*lock.Lease, error) {
	switch {
	case spec.Contention == Skip:
		s.metrics.JobsProcessed.WithLabelValues(job.Type, ResultSkipped).Inc()
		s.log.Info("lock busy; task skipped as a duplicate", "type", job.Type, "id", job.ID, "resource", job.Resource)
		if w := t.ResultWriter(); w != nil {
			_, _ = w.Write([]byte(ResultSkipped)) // kept with the task when it has a retention
		}
		return nil, nil
	case spec.Contention == Wait:
		s.log.Debug("lock busy; task waits in the worker", "type", job.Type, "id", job.ID, "resource", job.Resource,
			"max_wait", spec.ContentionWait)
		lease, err := s.waitInWorker(ctx, job, ttl, spec.ContentionWait)
		switch {
		case lease != nil || err != nil:
			return lease, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case job.Attempt <= job.MaxRetry:
			// Waited long enough: parked from now on, at the end of the queue.
			r, err := s.take(ctx, job, ttl, true, nil)
			switch {
			case err != nil:
				return nil, soon(stepLock, job, err)
			case r.Done:
				return nil, s.replay(job, r.Outcome)
			case r.Lease != nil:
				return r.Lease, nil
			}
			return nil, s.requeue(job, r)
		}
	case job.Attempt <= job.MaxRetry:
		return nil, s.requeue(job, r)
	}
	// asynq archives a task that fails with no retries left, even when
	// IsFailure says it did not fail: such a task cannot be requeued and
	// waits for its lock here instead.
	s.log.Debug("lock busy and no retries left to requeue with; waiting", "type", job.Type, "id", job.ID, "resource", job.Resource)
	lease, err := s.waitInWorker(ctx, job, ttl, 0)
	if lease == nil && err == nil {
		err = fmt.Errorf("jobs: %s: lock %q still busy when the task's context ended (no retries left to requeue with): %w",
			job.Type, job.Resource, lock.ErrNotAcquired)
	}
	return lease, err
}

// run runs the handler, under the watchdog when it holds lease, and turns the
// outcome into asynq's result. The handler's return value decides
// (G8 in the README's guarantees): nil is done, even when the lock turns out lost afterwards
// (counted and logged, never a reason to run the work again); an error is
// retried, soon and recorded lock_lost when the lock was lost.
//
// h, with a lease, is what the release does besides releasing: hand the
// lock on to the next waiter (chain.go).
func (s *Server) run(ctx context.Context, spec *Spec, job Job, payload any, lease *lock.Lease, h *handoff) error {
	hctx := ctx
	var hold *watchdog.Hold
	var span *tracing.Hold
	if lease != nil {
		ctx, span = s.trace.StartHold(ctx, job.Resource, lease.Fence()) // tracing
		if job.limit > 1 || lease.Permit() > 0 {
			span.Permit(lease.Permit())
		}
		opts := []watchdog.HoldOption{watchdog.LogWith("task_id", job.ID, "type", job.Type)}
		if spec.StallAfter > 0 {
			opts = append(opts, watchdog.StallAfter(spec.StallAfter))
		}
		if spec.MaxHold > 0 {
			opts = append(opts, watchdog.MaxHold(spec.MaxHold))
		}
		hctx, hold = s.watchdog.Hold(ctx, lease, opts...)
		span.Watch(hctx) // tracing: a loss is an event at once
		s.track(hold)
		defer s.untrack(hold)
		job.Fence, job.Permit = lease.Fence(), lease.Permit()
	}
	start := time.Now()
	debug := s.log.Enabled(ctx, slog.LevelDebug) // the lines below cost allocations even when off
	if debug {
		s.log.Debug("job started", "type", job.Type, "id", job.ID, "attempt", job.Attempt, "resource", job.Resource, "fence", job.Fence)
	}
	err := s.call(hctx, spec, job, payload)

	var lost *lock.LostError
	if hold != nil {
		// Release (and hand on to the next waiter) even when ctx ended: shutdown.
		var opts []watchdog.FinishOption
		if h != nil {
			h.outcome = outcomeOf(ctx, err)
			release := s.release(lease, job, h)
			if h.release != nil { // a lock taken through the Locker: no hand-off
				release = func(ctx context.Context) error { return h.release(ctx, h.outcome) }
			}
			opts = append(opts, watchdog.ReleaseWith(release))
		}
		var relErr error
		if lost, relErr = hold.Finish(ctx, opts...); relErr != nil {
			s.log.Warn("release failed; the lock expires within its TTL", "resource", job.Resource, "err", relErr)
		}
		if h != nil && h.next != nil {
			h.from = span.SpanContext() // tracing: the next run links to this hold
		}
		span.End(lost, h != nil && h.next != nil) // tracing
	}

	if lost != nil {
		if rerr := s.proc.RecordLoss(ctx, hold.Lease(), lost, job.Type, job.Queue, job.ID); rerr != nil {
			s.log.Debug("record lock loss failed", "resource", job.Resource, "err", rerr)
		}
	}
	result := ResultSuccess
	switch {
	case err == nil && lost != nil:
		s.log.Warn("handler returned nil after its lock was lost; the task is done and is not run again",
			"type", job.Type, "id", job.ID, "resource", job.Resource, "fence", job.Fence, "reason", string(lost.Reason))
	case err != nil && lost != nil:
		result = ResultLockLost
		err = &lostError{lost: lost, handler: err}
		s.log.Warn("lock lost and the handler failed; the task will be retried", "type", job.Type, "id", job.ID,
			"resource", job.Resource, "fence", job.Fence, "err", err)
	case err != nil:
		result = ResultFailure
	}
	s.metrics.JobsProcessed.WithLabelValues(job.Type, result).Inc()
	if debug {
		s.log.Debug("job finished", "type", job.Type, "id", job.ID, "resource", job.Resource, "fence", job.Fence,
			"result", result, "duration", time.Since(start), "err", err)
	}
	return err
}

// call runs the handler, turning a panic into an error so the lock is
// released on the way out.
func (s *Server) call(ctx context.Context, spec *Spec, job Job, payload any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("handler panicked", "type", job.Type, "id", job.ID, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("jobs: %s handler panicked: %v", job.Type, r)
		}
	}()
	return spec.Run(ctx, job, payload)
}

func (s *Server) enter() {
	s.mu.Lock()
	s.inflight++
	s.mu.Unlock()
}

func (s *Server) leave() {
	s.mu.Lock()
	if s.inflight--; s.inflight == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
	s.mu.Unlock()
}

// whenIdle returns a channel closed once no ProcessTask call runs.
func (s *Server) whenIdle() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := make(chan struct{})
	if s.inflight == 0 {
		close(c)
	} else {
		s.idle = c
	}
	return c
}

func (s *Server) track(h *watchdog.Hold) {
	s.mu.Lock()
	s.holds[h] = struct{}{}
	s.mu.Unlock()
}

func (s *Server) untrack(h *watchdog.Hold) {
	s.mu.Lock()
	delete(s.holds, h)
	s.mu.Unlock()
}

// jobOf reads the task's identity from asynq's context.
func jobOf(ctx context.Context, taskType string) Job {
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	return Job{ID: id, Type: taskType, Queue: queue, Attempt: retried + 1, MaxRetry: maxRetry}
}
