package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// Values of lockstep_scheduler_ticks_total{result}.
const (
	ResultEnqueued  = "enqueued"  // this replica won the tick (on time, or by takeover) and enqueued it
	ResultFollower  = "follower"  // another replica had the tick
	ResultDuplicate = "duplicate" // this replica won the tick but its task id existed already
	ResultMissed    = "missed"    // dropped by the catch-up policy (or too old to take over)
	ResultCaughtUp  = "caught_up" // enqueued late, by the catch-up policy
	// ResultSkippedOverlap: this replica won the tick and skipped it: an
	// earlier run was queued or running (overlap skip or buffer_one).
	ResultSkippedOverlap = "skipped_overlap"
	// ResultBackfilled: ticks a backfill enqueued (Store.Backfill, in the
	// CLI or the Go client), counted by the replica that sweeps the
	// schedule once the backfill has counted them in its state (sweepOnce).
	ResultBackfilled = "backfilled"
	// ResultSkippedPaused: ticks due while the schedule was paused, dropped
	// by the catch-up policy at its resume: an operator's choice, not a
	// miss (lockstep_scheduler_ticks_missed_total leaves them out).
	ResultSkippedPaused = "skipped_paused"
)

const (
	// claimMargin is how much later than max_clock_skew an on-time claim may
	// reach Redis: timer and scheduling delay, a round trip, a short retry.
	// A tick older than max_clock_skew + claimMargin that nobody claimed is
	// missed, and the catch-up policy decides about it.
	claimMargin = time.Second
	// minStateTTL is how long a schedule's watermark and pending set outlive
	// their last claim: longer than any cron period (a leap year plus).
	minStateTTL = 400 * 24 * time.Hour
	// sweepLimit bounds the pending ticks one sweep reads per schedule.
	sweepLimit = 100
)

// Scheduler runs one replica of Lockstep's scheduler: every schedule's ticks,
// claimed in Redis so that each is enqueued into asynq exactly once across all
// replicas. See the package documentation for the protocol.
type Scheduler struct {
	client    redis.UniversalClient
	scripts   *runner
	enq       *asynq.Client
	insp      *asynq.Inspector // asynq's state of earlier runs (overlap policies)
	file      []*entry         // the config's schedules
	store     *Store
	prefix    string
	maxCatch  int           // scheduler.max_catch_up, for run-time schedules without their own
	resync    time.Duration // how often the run-time schedules' version is checked
	skew      time.Duration
	lease     time.Duration
	retention time.Duration
	lateAfter time.Duration // a tick this old and unclaimed is missed
	horizon   time.Duration // a pending tick this old is not taken over
	stateTTL  time.Duration
	sweep     time.Duration

	clock Clock
	log   *slog.Logger
	m     *metrics.Metrics
	trace *tracing.Tracer // nil: tracing off
	id    string
	seq   atomic.Uint64
	hooks hooks

	earlyLogged atomic.Int64 // when "clock ahead" was last logged, Unix ns

	life      lifecycle.Machine
	loops     context.Context    // parent of every schedule's loop
	fires     context.Context    // parent of every tick in flight
	stopLoops context.CancelFunc // ends the waiting: no new ticks
	stopFires context.CancelFunc // aborts ticks in flight
	stopRun   chan struct{}      // ends the script runner, last
	wg        sync.WaitGroup
	runnerWG  sync.WaitGroup
	running   atomic.Bool

	liveMu  sync.Mutex
	live    map[string]*liveEntry // schedules whose loop runs, by name
	paused  map[string]bool       // known schedules that are paused
	shadow  map[string]bool       // run-time names that a file schedule shadows (logged once)
	labeled int                   // run-time schedules with their own tick series
	applied atomic.Int64          // version of the run-time schedules last applied

	replicas atomic.Pointer[[]string] // the live replicas, from the last heartbeat
	digests  string                   // prefix of the claim digests; "" in a Cluster (follow.go)
	followMu sync.Mutex
	follow   map[int64]*followView // by second
	// followerChecks counts the follower ticks checked one by one (tests).
	followerChecks atomic.Int64
	crashed        atomic.Bool // died as by SIGKILL (crash, tests only): no clean leave
}

// liveEntry is a schedule whose loop runs.
type liveEntry struct {
	e    *entry
	stop context.CancelFunc
}

// resyncInterval is how often a replica checks the run-time schedules'
// version, in case it missed a change's pub/sub notice (a reconnect).
const resyncInterval = 500 * time.Millisecond

// Option configures a Scheduler.
type Option func(*Scheduler)

// WithClock sets the clock that says when ticks are due (default SystemClock).
func WithClock(c Clock) Option { return func(s *Scheduler) { s.clock = c } }

// WithMetrics records tick results, lateness and leader changes in m.
func WithMetrics(m *metrics.Metrics) Option { return func(s *Scheduler) { s.m = m } }

// WithTracerProvider traces every tick (lockstep.tick) and its enqueue with
// tp; the enqueue's trace context goes in the task's headers. A nil or no-op
// tp is tracing off.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(s *Scheduler) { s.trace = tracing.New(tp) }
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(s *Scheduler) { s.log = l } }

// WithReplicaID names this replica in Redis and in logs (default:
// host:pid-random). It must differ between replicas.
func WithReplicaID(id string) Option { return func(s *Scheduler) { s.id = id } }

// hooks let tests observe ticks and kill a replica at chosen points; they
// are set only by tests (withHooks, in export_test.go), like every test hook
// in Lockstep.
type hooks struct {
	// afterClaim and afterEnqueue run once this replica won a tick; true
	// makes the replica die on the spot, as a SIGKILL would: nothing more is
	// written to Redis by it.
	afterClaim   func(schedule string, tick time.Time) bool
	afterEnqueue func(schedule string, tick time.Time) bool
	event        func(event)
}

// event is one outcome of one tick on one replica, reported to test hooks.
type event struct {
	Replica  string
	Schedule string
	Tick     time.Time
	Result   string        // a Result* value, "early" (refused: clock ahead), or "caught_up_done" once a catch-up pass ended
	Count    int           // ticks the event stands for (missed ranges)
	Lateness time.Duration // enqueued: enqueue time − Tick on the replica's clock
}

// New returns a scheduler for c's schedules over client. It validates the
// schedules (see Validate) and the scheduler settings and does not touch
// Redis; Start does.
func New(client redis.UniversalClient, c *config.SchedulerConfig, opts ...Option) (*Scheduler, error) {
	entries, err := parseEntries(c)
	if err != nil {
		return nil, err
	}
	set := c.Scheduler
	scripts := newRunner(client)
	s := &Scheduler{
		client:    client,
		scripts:   scripts,
		enq:       asynq.NewClientFromRedisClient(scripts.enqueueClient()),
		insp:      asynq.NewInspectorFromRedisClient(client),
		file:      entries,
		store:     NewStore(client, c.Lock.Prefix),
		prefix:    c.Lock.Prefix,
		maxCatch:  set.MaxCatchUp,
		resync:    resyncInterval,
		live:      map[string]*liveEntry{},
		paused:    map[string]bool{},
		shadow:    map[string]bool{},
		follow:    map[int64]*followView{},
		skew:      set.MaxClockSkew,
		lease:     set.TickLockTTL,
		retention: set.TaskRetention,
	}
	if !scripts.cluster {
		s.digests = s.store.k.claimed
	}
	s.lateAfter = s.skew + claimMargin
	s.horizon = s.retention - 2*s.skew - s.lease
	s.stateTTL = max(minStateTTL, 2*s.retention)
	s.sweep = max(s.lease/2, 50*time.Millisecond)
	for _, o := range opts {
		o(s)
	}
	if s.clock == nil {
		s.clock = SystemClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.m = metrics.OrNop(s.m)
	if s.id == "" {
		s.id = defaultReplicaID()
	}
	s.log = s.log.With("replica", s.id)
	return s, nil
}

func defaultReplicaID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return procid.Self() + "-" + hex.EncodeToString(b)
}

// Start starts one goroutine per schedule and one that takes over unfinished
// ticks. Redis need not be reachable: the loops retry, and ticks that nobody
// could claim are handled by the catch-up policy once it is back. Like every
// background service it follows internal/lifecycle: it returns at once, a
// repeated Start does nothing, a Start after Stop fails.
func (s *Scheduler) Start(context.Context) error { return s.life.Start(s.start) }

func (s *Scheduler) start() error {
	loops, stopLoops := context.WithCancel(context.Background())
	fires, stopFires := context.WithCancel(context.Background())
	s.stopLoops, s.stopFires = stopLoops, stopFires
	s.running.Store(true)
	s.stopRun = make(chan struct{})
	s.runnerWG.Go(func() { s.scripts.loop(s.stopRun) })
	s.loops, s.fires = loops, fires
	s.apply(snapshot{}) // the file's schedules, until Redis says more
	s.wg.Go(func() { s.syncer(loops) })
	s.wg.Go(func() { s.sweeper(loops, fires) })
	s.log.Info("scheduler started", "schedules", len(s.file), "max_clock_skew", s.skew,
		"tick_lock_ttl", s.lease, "task_retention", s.retention)
	return nil
}

// Stop stops taking new ticks, lets ticks in flight finish until ctx ends
// (then aborts them: their leases expire and other replicas take them over)
// and waits for every goroutine. Like every background service it follows
// internal/lifecycle: it is safe before Start and to repeat, and a Stop that
// finds another under way waits for it, bounded by its own ctx.
func (s *Scheduler) Stop(ctx context.Context) error { return s.life.Stop(ctx, s.stop) }

func (s *Scheduler) stop(ctx context.Context) error {
	s.running.Store(false)
	s.stopLoops()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.stopFires()
	<-done
	close(s.stopRun)
	s.runnerWG.Wait()
	s.log.Info("scheduler stopped")
	return err
}

// crash ends the replica at once, as SIGKILL would (the hooks' afterClaim
// and afterEnqueue, and tests, call it).
func (s *Scheduler) crash() {
	s.crashed.Store(true)
	s.running.Store(false)
	s.stopLoops()
	s.stopFires()
}

// Ready reports whether the scheduler runs: started, not stopped. Redis
// reachability is a separate check.
func (s *Scheduler) Ready(context.Context) error {
	if !s.running.Load() {
		return errors.New("scheduler not running")
	}
	return nil
}

// loop runs one schedule: a catch-up pass at start, then every tick when it
// is due. Ticks are fired in order; a tick found later than lateAfter (the
// process stalled, Redis was down, the clock jumped) goes to the catch-up
// policy instead.
func (s *Scheduler) loop(loops, fires context.Context, e *entry) {
	h := health{log: s.log, what: "schedule " + e.name}
	e.unsettle(s.clock.Now().Unix()) // ticks before this loop: not seen done here
	cursor := s.clock.Now().Add(-s.lateAfter)
	if since := time.Unix(e.since, 0); e.since > 0 && cursor.Before(since) {
		cursor = since // ticks of a new or changed spec start after it took effect
	}
	err := s.catchUp(loops, fires, e, cursor)
	h.report(err)
	pendingCatchUp := err != nil
	for {
		n := e.spec.Next(cursor)
		if n.IsZero() {
			s.log.Warn("schedule has no more ticks", "schedule", e.name)
			return
		}
		if !s.sleepUntil(loops, n) {
			return
		}
		now := s.clock.Now()
		late := now.Sub(n) > s.lateAfter
		if late || pendingCatchUp {
			cutoff := now.Add(-s.lateAfter)
			if !late {
				// An earlier tick could not be claimed (Redis stalled): it
				// goes to the catch-up policy before n is claimed, since
				// claiming n would move the watermark past it for good.
				cutoff = n.Add(-time.Nanosecond)
			}
			err := s.catchUp(loops, fires, e, cutoff)
			h.report(err)
			pendingCatchUp = err != nil
			if late || pendingCatchUp {
				// Still failing: n joins the ticks the next catch-up
				// pass decides on, rather than jumping the gap.
				cursor = n
				if late {
					cursor = cutoff
				}
				continue
			}
		}
		// A tick nobody could claim is left to the catch-up policy.
		if err := s.fire(fires, e, n, onTime); err != nil {
			h.report(fmt.Errorf("tick %v not claimed: %w", n.UTC(), err))
			pendingCatchUp = true
		} else if !pendingCatchUp {
			h.report(nil)
		}
		cursor = n
	}
}

// health logs when a loop starts failing to reach Redis and when it
// recovers, not at every attempt in between.
type health struct {
	log     *slog.Logger
	what    string
	failing bool
}

func (h *health) report(err error) {
	switch {
	case err != nil && !h.failing && !errors.Is(err, context.Canceled):
		h.log.Error("Redis calls failing; ticks meanwhile go to the catch-up policy", "loop", h.what, "err", err)
	case err == nil && h.failing:
		h.log.Info("Redis calls work again", "loop", h.what)
	}
	h.failing = err != nil
}

// sleepUntil waits until the clock reaches t, or loops ends (false).
func (s *Scheduler) sleepUntil(loops context.Context, t time.Time) bool {
	tm := s.clock.TimerAt(t)
	defer tm.Stop()
	select {
	case <-tm.C():
		return true
	case <-loops.Done():
		return false
	}
}

// sweeper takes over ticks whose leader died between claim and done. It runs
// on real time, not on the injected clock, because leases are measured by
// Redis's clock.
func (s *Scheduler) sweeper(loops, fires context.Context) {
	t := time.NewTicker(s.sweep)
	defer t.Stop()
	h := health{log: s.log, what: "sweep"}
	for n := 0; ; n++ {
		s.sweepOnce(fires, &h, n%fullSweepEvery == 0)
		select {
		case <-t.C:
		case <-loops.Done():
			return
		}
	}
}

// fullSweepEvery is how many sweeps pass between two that read every
// schedule of this replica's share; the others read only those with a tick
// due lately, the only ones whose leader can have died just now.
const fullSweepEvery = 20

// sweepOnce reads the pending ticks of this replica's share of the
// schedules (those it claims first): a dead replica's share passes to the
// others with the live set, so every schedule is swept by a live replica
// and none by all of them. Between full sweeps it reads only the schedules
// with a tick in the last 2 × tick_lock_ttl + max_clock_skew + 1s that this
// replica did not see done (it was not the one that enqueued it, or its
// done failed): the only ones whose leader can have died just now.
func (s *Scheduler) sweepOnce(ctx context.Context, h *health, full bool) {
	var entries []*entry
	recent := s.clock.Now().Add(-2*s.lease - s.lateAfter).Unix()
	for _, e := range s.liveEntries() {
		if s.first(e.name) && (full || e.unsettled.Load() >= recent) {
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		return
	}
	cmds := make([]*redis.MapStringStringCmd, len(entries))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			cmds[i] = p.HGetAll(ctx, e.keys.state)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		h.report(err)
		return
	}
	h.report(nil)
	for i, e := range entries {
		if _, ok := cmds[i].Val()[backfilledField]; ok {
			s.takeBackfilled(ctx, e)
		}
		var ticks []int64
		for field, value := range cmds[i].Val() {
			if u, _, _, ok := parsePending(field, value); ok {
				ticks = append(ticks, u)
			}
		}
		slices.Sort(ticks)
		for _, u := range ticks[:min(len(ticks), sweepLimit)] {
			if ctx.Err() != nil {
				return
			}
			if err := s.fire(ctx, e, time.Unix(u, 0).UTC(), takeover); err != nil && ctx.Err() == nil {
				s.log.Warn("takeover failed", "schedule", e.name, "tick", u, "err", err)
			}
		}
	}
}

// takeBackfilled takes the count of e's backfilled ticks from its state
// (backfilled.lua) and adds it to this replica's ticks_total{result=
// "backfilled"}: HGET and HDEL in one MULTI, so that of two replicas
// sweeping e at once (their views of the live set differ) one counts them,
// and a backfill's increment meanwhile is counted by the next sweep.
func (s *Scheduler) takeBackfilled(ctx context.Context, e *entry) {
	var n *redis.StringCmd
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		n = p.HGet(ctx, e.keys.state, backfilledField)
		p.HDel(ctx, e.keys.state, backfilledField)
		return nil
	})
	if err != nil {
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			s.log.Warn("taking the count of backfilled ticks failed; the next sweep takes it", "schedule", e.name, "err", err)
		}
		return
	}
	if v, err := n.Int(); err == nil {
		s.count(e, s.clock.Now(), ResultBackfilled, v)
	}
}

func (s *Scheduler) emit(e *entry, tick time.Time, result string, n int, late time.Duration) {
	if s.hooks.event != nil {
		s.hooks.event(event{Replica: s.id, Schedule: e.name, Tick: tick, Result: result, Count: n, Lateness: late})
	}
}

// count records n ticks of e with result.
func (s *Scheduler) count(e *entry, tick time.Time, result string, n int) {
	if n <= 0 {
		return
	}
	s.m.SchedulerTicks.WithLabelValues(e.label, result).Add(float64(n))
	if result == ResultMissed {
		s.m.SchedulerTicksMissed.Add(float64(n))
	}
	s.emit(e, tick, result, n, 0)
}

// retry calls f until it succeeds or ctx ends, with jittered backoff. It
// returns f's last error.
func retry(ctx context.Context, f func(context.Context) error) error {
	var delay time.Duration
	for {
		err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		delay = backoff.RedisRetry.Next(delay)
		if !backoff.Sleep(ctx, delay) {
			return err
		}
	}
}
