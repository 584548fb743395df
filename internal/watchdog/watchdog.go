package watchdog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/lifecycle"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// ErrStopped is the cause given to holds still open when the watchdog stops.
var ErrStopped = errors.New("watchdog: stopped")

// Options configure a Watchdog. Zero values take the defaults.
type Options struct {
	// Interval between renewals of a lease; default TTL/3.
	Interval time.Duration
	// DriftMargin is subtracted from the local deadline (last renewal's send
	// time + TTL) to allow for clock-rate differences and the time a handler
	// needs to notice its context; default TTL/10 (at least 2ms).
	DriftMargin time.Duration
	// RetryInterval is the wait after a renewal failed with a transport error;
	// default Interval/5 (at least 5ms).
	RetryInterval time.Duration
	// MaxHold bounds how long any lease is kept; 0 means no bound.
	MaxHold time.Duration
	// Notifier, when set, tells the watchdog at once when a held key changes
	// on the server (deleted, overwritten, expired), so a loss is found in
	// milliseconds instead of at the next renewal. Nil: renewals alone.
	Notifier Notifier
	// NoticeAfter is how old a hold must be before the Notifier is needed:
	// it runs while any hold is at least that old (and for NoticeLinger
	// after the last one ended), so a process whose holds all end sooner
	// (short jobs) pays nothing for notices. When it starts, every lease is
	// checked at once, so a loss in a hold's first NoticeAfter is found a
	// few milliseconds after it turns that old. Default 50ms; negative:
	// always running.
	NoticeAfter time.Duration
	// NoticeLinger keeps the Notifier running after the last hold older
	// than NoticeAfter ended; default 10s.
	NoticeLinger time.Duration
	// ReleaseTimeout bounds the release in Hold.Finish; default 5s.
	ReleaseTimeout time.Duration

	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// HoldOption overrides the watchdog's Options for one hold.
type HoldOption func(*holdConfig)

type holdConfig struct {
	interval, drift, retry, maxHold time.Duration
	stallAfter                      time.Duration
	logAttrs                        []any
	explain                         func(*lock.LostError) error
}

// LogWith adds attributes (e.g. "task_id", id) to every log line about one hold.
func LogWith(attrs ...any) HoldOption {
	return func(c *holdConfig) { c.logAttrs = append(c.logAttrs, attrs...) }
}

// Explain lets the holder say why a loss happened: when the watchdog finds
// the lease lost, the hold's context is cancelled with fn's error instead
// of the *lock.LostError, if fn returns one that wraps it (errors.Is(err,
// lock.ErrLockLost)); nil keeps the LostError. fn runs once, on the
// watchdog's goroutine before the cancel, so it must be quick and bounded
// (a schedule's run lock reads which tick cancelled its run: one read).
func Explain(fn func(*lock.LostError) error) HoldOption {
	return func(c *holdConfig) { c.explain = fn }
}

// MaxHold bounds how long one hold is kept: past it the hold is given up
// (reason max_hold): its context is cancelled and its lock released at once,
// handed to the next waiter.
func MaxHold(d time.Duration) HoldOption { return func(c *holdConfig) { c.maxHold = d } }

// StallAfter gives the hold up (reason stalled) once its holder has reported
// no Progress for d (counted from the acquire until the first): its context
// is cancelled and its lock released at once, handed to the next waiter, as
// MaxHold does. A holder stuck in a call that ignores its context so keeps
// no one waiting, and a store that checks fences refuses its late writes.
func StallAfter(d time.Duration) HoldOption { return func(c *holdConfig) { c.stallAfter = d } }

// Watchdog renews every lease handed to it and cancels the lease's context
// the moment the lease is lost. One per process is enough: renewals that
// fall due together share round trips.
type Watchdog struct {
	opts    Options
	metrics *metrics.Metrics
	log     *slog.Logger

	mu         sync.Mutex
	holds      map[*Hold]struct{}
	byKey      map[string][]*Hold    // Redis key -> holds on it (mostly one)
	lossHooked map[*lock.Locker]bool // Lockers whose loss notices reach onLoss
	notices    noticeBook            // expected and recent notices
	stopped    bool

	notice noticeDemand // guarded by mu
	wakeAt time.Time    // when the loop wakes next, unless poked; guarded by mu

	wake chan struct{} // a hold was added or is due earlier
	quit chan struct{}
	done chan struct{}
	life lifecycle.Machine

	hooks hooks // nil outside tests
}

// hooks let tests reach into the loop; they are set only by tests
// (export_test.go), like every test hook in Lockstep.
type hooks struct {
	// renew runs for each lease while a round is built; tests use it to
	// inject a panic into one renewal.
	renew func(*lock.Lease)
}

// New returns a watchdog. Its loop starts with the first Hold (or Start).
func New(opts Options) *Watchdog {
	return &Watchdog{
		opts:       opts,
		metrics:    metrics.OrNop(opts.Metrics),
		log:        cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		holds:      map[*Hold]struct{}{},
		byKey:      map[string][]*Hold{},
		lossHooked: map[*lock.Locker]bool{},
		notices:    newNoticeBook(),
		notice:     noticeDemand{n: opts.Notifier, always: opts.NoticeAfter < 0},
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
	}
}

// Start starts the renewal loop (and the notice listener); the first Hold
// starts it too. Like every background service it follows internal/lifecycle:
// it returns at once, a repeated Start does nothing, a Start after Stop fails.
func (w *Watchdog) Start(context.Context) error { return w.life.Start(w.start) }

func (w *Watchdog) start() error {
	go w.loop()
	return nil
}

// Stop ends the renewal loop and cancels every hold still open with cause
// ErrStopped. It does not release leases: their holders do. It waits for an
// in-flight round, bounded by ctx. Like every background service it follows
// internal/lifecycle: it is safe before Start and to repeat, and a Stop that
// finds another under way waits for it, bounded by its own ctx.
func (w *Watchdog) Stop(ctx context.Context) error { return w.life.Stop(ctx, w.stop) }

func (w *Watchdog) stop(ctx context.Context) error {
	w.mu.Lock()
	w.stopped = true
	holds := make([]*Hold, 0, len(w.holds))
	for h := range w.holds {
		holds = append(holds, h)
	}
	w.mu.Unlock()
	close(w.quit)
	for _, h := range holds {
		h.end(ErrStopped)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	// The loop has ended: no notifier starts any more.
	w.mu.Lock()
	w.notice.stop()
	w.mu.Unlock()
	return w.notice.wait(ctx)
}

// Held returns the number of leases being renewed.
func (w *Watchdog) Held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.holds)
}

// Hold starts renewing lease and returns a context derived from ctx that is
// cancelled, with a cause matching lock.ErrLockLost, as soon as the lease is
// lost: at once when a renewal finds the token gone (stolen, expired), when
// the local deadline passes without a successful renewal (unreachable), or
// when the max hold is reached (max_hold).
//
// The caller owns the lease: it must end the hold with Hold.Release (stop
// renewing, then release) or Hold.Stop (stop renewing only) when its work is
// done. The watchdog never releases a lease.
func (w *Watchdog) Hold(ctx context.Context, lease *lock.Lease, opts ...HoldOption) (context.Context, *Hold) {
	ttl := lease.TTL()
	cctx, cancel := context.WithCancelCause(ctx)
	h := &Hold{
		w:      w,
		lease:  lease,
		cancel: cancel,
		cfg: holdConfig{
			interval: w.opts.Interval,
			drift:    w.opts.DriftMargin,
			retry:    w.opts.RetryInterval,
			maxHold:  w.opts.MaxHold,
		},
		heldFrom: time.Now(),
		span:     trace.SpanContextFromContext(ctx),
	}
	c := &h.cfg // the options apply in place: nothing more to allocate
	for _, o := range opts {
		o(c)
	}
	c.interval = cmp.Or(c.interval, ttl/3)
	c.drift = cmp.Or(c.drift, max(ttl/10, 2*time.Millisecond))
	c.retry = cmp.Or(c.retry, max(c.interval/5, 5*time.Millisecond))
	h.sent = lease.AcquiredAt()
	h.next = lease.AcquiredAt().Add(c.interval)
	h.deadline = lease.AcquiredAt().Add(ttl - c.drift)
	h.setDeadline(h.deadline)
	hctx := &leaseContext{Context: cctx, h: h}
	started := w.life.Start(w.start) == nil // fails once stopped, even if never started
	w.mu.Lock()
	if !started || w.stopped {
		h.ended = true
		w.mu.Unlock()
		cancel(ErrStopped)
		return hctx, h
	}
	w.holds[h] = struct{}{}
	if l := lease.Locker(); !w.lossHooked[l] {
		w.lossHooked[l] = true
		l.NotifyLoss(w.onLoss) // a back end that watches its own keys (etcd)
	}
	key := lease.RedisKey()
	w.byKey[key] = append(w.byKey[key], h)
	if !lease.Reentrant() && w.notice.running() {
		// The acquire wrote the key, which the server announces; that notice
		// is ours unless more than one arrived since the acquire was sent.
		switch n := w.notices.seenSince(key, lease.AcquiredAt()); {
		case n == 0:
			w.notices.expect(key, time.Now().Add(noticeGrace))
		case n > 1:
			h.next = time.Now() // something else changed it too: check now
		}
	}
	// Timers start under the lock so that end, which takes it, sees them.
	h.timer = time.AfterFunc(time.Until(h.deadline), h.onDeadline)
	if c.maxHold > 0 {
		h.maxTimer = time.AfterFunc(time.Until(lease.AcquiredAt().Add(c.maxHold)), func() {
			h.giveUp(lock.ReasonMaxHold)
		})
	}
	if c.stallAfter > 0 {
		h.progressNs.Store(int64(time.Since(epoch)))
		h.stallTimer = time.AfterFunc(c.stallAfter, h.onStallCheck)
		// Its renewals leave its last progress for `lockstep locks`.
		lease.ReportProgress(func() time.Time { return epoch.Add(time.Duration(h.progressNs.Load())) })
	}
	// Poke the loop only when this hold needs it sooner than it wakes: a
	// burst of short holds then costs the loop nothing.
	first := h.next
	if w.notice.wanted() && !w.notice.running() {
		first = earlier(first, h.heldFrom.Add(w.noticeAfter()))
	}
	poke := first.Before(w.wakeAt)
	w.mu.Unlock()
	w.metrics.LocksHeld.Inc()
	if poke {
		w.poke()
	}
	return hctx, h
}

func (w *Watchdog) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// loop is the watchdog's one goroutine: sleep until the earliest renewal is
// due, renew every lease due by then (plus a little slack, so leases falling
// due together share a round), repeat. It also starts and stops the
// Notifier as the holds' ages ask for it (NoticeAfter).
func (w *Watchdog) loop() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(max(time.Until(w.plan()), 0))
		select {
		case <-w.quit:
			return
		case <-w.wake:
			continue
		case <-timer.C:
		}
		w.round()
	}
}

// plan returns when the loop must wake next (the earliest renewal due, or
// the moment the Notifier must start or may stop), and starts or stops the
// Notifier for now.
func (w *Watchdog) plan() time.Time {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	next := now.Add(time.Hour)
	after := w.noticeAfter()
	long, young, oldest := false, time.Time{}, now
	for h := range w.holds {
		next = earlier(next, h.next)
		oldest = earlier(oldest, h.heldFrom)
		if at := h.heldFrom.Add(after); !at.After(now) {
			long = true
		} else if young.IsZero() || at.Before(young) {
			young = at
		}
	}
	w.metrics.OldestHold.Set(now.Sub(oldest).Seconds())
	if w.notice.wanted() {
		if long || w.notice.always {
			w.notice.lastLong = now
			if !w.notice.running() {
				w.notice.start(w.onNotice, &w.mu)
			}
		} else if w.notice.running() {
			if end := w.notice.lastLong.Add(cmp.Or(w.opts.NoticeLinger, defaultNoticeLinger)); end.After(now) {
				next = earlier(next, end)
			} else {
				w.notice.stop()
			}
		}
		if !w.notice.running() && !young.IsZero() {
			next = earlier(next, young)
		}
	}
	w.wakeAt = next
	return next
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (w *Watchdog) noticeAfter() time.Duration {
	return cmp.Or(w.opts.NoticeAfter, defaultNoticeAfter)
}

// round renews every due lease. It is supervised: a panic is recovered,
// counted and logged, and the leases of that round are retried soon.
func (w *Watchdog) round() {
	now := time.Now()
	var due []*Hold
	w.mu.Lock()
	for h := range w.holds {
		if !h.next.After(now.Add(h.cfg.interval / 4)) {
			due = append(due, h)
		}
	}
	w.mu.Unlock()
	if len(due) == 0 {
		return
	}

	// Group by Locker (a process usually has one) and build each batch; a
	// panic while handling one lease skips that lease only.
	byLocker := map[*lock.Locker][]*Hold{}
	for _, h := range due {
		if w.guard(h, func() {
			if w.hooks.renew != nil {
				w.hooks.renew(h.lease)
			}
		}) {
			byLocker[h.lease.Locker()] = append(byLocker[h.lease.Locker()], h)
		}
	}
	var wg sync.WaitGroup
	for l, holds := range byLocker {
		wg.Go(func() { w.renew(l, holds) })
	}
	wg.Wait()
}

// guard runs f for h, recovering a panic; it reports whether f completed.
func (w *Watchdog) guard(h *Hold, f func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			w.metrics.Renewals.WithLabelValues(metrics.RenewalPanic).Inc()
			w.log.Error("watchdog: recovered panic in renewal", "key", h.lease.Key(), "panic", fmt.Sprint(r))
			h.retryAt(time.Now())
			ok = false
		}
	}()
	f()
	return true
}

// renew sends one renewal round for holds of one Locker.
func (w *Watchdog) renew(l *lock.Locker, holds []*Hold) {
	defer func() {
		if r := recover(); r != nil {
			w.metrics.Renewals.WithLabelValues(metrics.RenewalPanic).Add(float64(len(holds)))
			w.log.Error("watchdog: recovered panic in renewal round", "leases", len(holds), "panic", fmt.Sprint(r))
			now := time.Now()
			for _, h := range holds {
				h.retryAt(now)
			}
		}
	}()
	// A round may not outlive the earliest deadline in it: past that, its
	// answer is useless and a late renewal would only delay the next holder.
	sent := time.Now()
	timeout := time.Duration(1<<63 - 1)
	leases := make([]*lock.Lease, len(holds))
	expected := make([]*expectation, len(holds))
	for i, h := range holds {
		leases[i] = h.lease
		timeout = min(timeout, h.deadlineIn(sent))
		expected[i] = w.expectRenewal(h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Millisecond))
	defer cancel()
	results := l.RenewAll(ctx, leases)
	w.metrics.RenewalDuration.Observe(time.Since(sent).Seconds())
	w.settleExpectations(leases, expected, results)
	for i, h := range holds {
		w.guard(h, func() { h.settle(sent, results[i]) })
	}
}

// Hold is one lease under the watchdog.
type Hold struct {
	w        *Watchdog
	lease    *lock.Lease
	cfg      holdConfig
	cancel   context.CancelCauseFunc
	heldFrom time.Time
	span     trace.SpanContext // the holder's span: lockstep_lock_held_seconds's exemplar

	deadlineNs atomic.Int64 // deadline as nanoseconds since epoch (monotonic), for checks at use
	counted    atomic.Bool  // a loss was counted (found by the watchdog or at release); the loss itself is the lease's
	progressNs atomic.Int64 // the holder's last Progress (or the hold's start), as deadlineNs; with StallAfter only

	// guarded by w.mu
	timer      *time.Timer // fires at deadline
	maxTimer   *time.Timer // fires at the max hold, if any
	stallTimer *time.Timer // fires when the hold stalls unless Progress came, with StallAfter
	unreturned bool        // a loss cancelled the work, which has not returned (Finish) yet
	sent       time.Time   // send time of the last successful renewal (or the acquire)
	deadline   time.Time   // sent + ttl - drift
	next       time.Time   // next renewal due
	ended      bool
}

// Lease returns the held lease.
func (h *Hold) Lease() *lock.Lease { return h.lease }

// logger is the watchdog's logger with the hold's attributes (LogWith),
// built when a line is written: most holds never log.
func (h *Hold) logger() *slog.Logger { return h.w.log.With(h.cfg.logAttrs...) }

// Stop ends renewal without releasing the lease, and cancels the hold's
// context (cause context.Canceled) unless it already ended. Safe to repeat.
func (h *Hold) Stop() { h.end(nil) }

func (h *Hold) deadlineIn(now time.Time) time.Duration {
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	return h.deadline.Sub(now)
}

func (h *Hold) retryAt(now time.Time) {
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	h.next = now.Add(h.cfg.retry)
}

// settle applies one renewal result.
func (h *Hold) settle(sent time.Time, err error) {
	m := h.w.metrics
	var lost *lock.LostError
	switch {
	case err == nil:
		m.Renewals.WithLabelValues(metrics.RenewalRenewed).Inc()
		h.w.mu.Lock()
		if h.ended {
			h.w.mu.Unlock()
			return
		}
		h.sent = sent
		h.deadline = sent.Add(h.lease.TTL() - h.cfg.drift)
		h.setDeadline(h.deadline)
		h.next = sent.Add(h.cfg.interval)
		h.timer.Reset(time.Until(h.deadline))
		h.w.mu.Unlock()
	case errors.As(err, &lost):
		m.Renewals.WithLabelValues(metrics.RenewalLost).Inc()
		h.lose(lost.Reason)
	default:
		m.Renewals.WithLabelValues(metrics.RenewalError).Inc()
		h.logger().Warn("watchdog: renewal failed; retrying until the local deadline",
			"key", h.lease.Key(), "error", err)
		h.retryAt(time.Now())
	}
}

// onDeadline runs from the deadline timer. A renewal that succeeded while
// the timer was firing has moved the deadline; then this is a stale firing.
func (h *Hold) onDeadline() {
	if int64(time.Since(epoch)) >= h.deadlineNs.Load() {
		h.lose(lock.ReasonUnreachable)
	}
}

// lose marks the lease lost and ends the hold with the loss as cause. It
// reports whether the loss is this call's (for reason, counted here).
func (h *Hold) lose(reason lock.Reason) bool {
	cause := h.lease.MarkLost(reason) // an earlier loss or release wins
	var lost *lock.LostError
	if !errors.As(cause, &lost) {
		h.end(nil) // released meanwhile: not a loss
		return false
	}
	// h.counted is the one gate for counting a loss, here and in Finish: the
	// hold may end (its work returned) while this runs, and the loss still
	// counts once.
	counted := h.counted.CompareAndSwap(false, true)
	var explained error
	if counted {
		// Counted before the holder's context ends, so that whoever sees
		// the loss there sees it counted too.
		h.w.metrics.LockLost.WithLabelValues(string(lost.Reason)).Inc()
		if h.cfg.explain != nil {
			if err := h.cfg.explain(lost); err != nil && errors.Is(err, lock.ErrLockLost) {
				cause, explained = err, err
			}
		}
	}
	ended := h.end(cause)
	if !counted {
		return false
	}
	msg := "watchdog: lock lost; handler context cancelled"
	if !ended {
		msg = "watchdog: lock lost as its work returned"
	}
	attrs := []any{"key", h.lease.Key(), "reason", string(lost.Reason), "fence", h.lease.Fence()}
	if explained != nil {
		attrs = append(attrs, "cause", explained.Error())
	}
	h.logger().Warn(msg, attrs...)
	return lost.Reason == reason
}

// giveUp ends a hold that its holder may not keep any longer (max_hold,
// stalled) while its process is alive: the lease is lost for reason, the
// holder's context cancelled, and the lock released at once by its token,
// which hands it to the next waiter (no one waits out a TTL). The work's
// own release, when it returns, finds the lock gone.
func (h *Hold) giveUp(reason lock.Reason) {
	if !h.lose(reason) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(h.w.opts.ReleaseTimeout, DefaultReleaseTimeout))
	defer cancel()
	if err := h.lease.Release(ctx); err != nil && !errors.Is(err, lock.ErrLockLost) {
		h.logger().Warn("watchdog: the release of a hold given up failed; it expires within its TTL",
			"key", h.lease.Key(), "reason", string(reason), "err", err)
	}
}

// onStallCheck runs from the stall timer: the hold stalls when no Progress
// came within StallAfter; else the timer waits for the rest of it.
func (h *Hold) onStallCheck() {
	left := time.Duration(h.progressNs.Load()) + h.cfg.stallAfter - time.Since(epoch)
	if left <= 0 {
		h.giveUp(lock.ReasonStalled)
		return
	}
	h.w.mu.Lock()
	if !h.ended {
		h.stallTimer.Reset(left)
	}
	h.w.mu.Unlock()
}

// Progress records that the holder of ctx's hold (a context Hold returned,
// or one derived from it) made progress now: a hold with StallAfter stalls
// only after that long without any. It is one atomic store, never a round
// trip; without a hold in ctx it does nothing.
func Progress(ctx context.Context) {
	if h, _ := ctx.Value(holdKey{}).(*Hold); h != nil {
		h.progressNs.Store(int64(time.Since(epoch)))
	}
}

// end removes the hold and cancels its context with cause; it reports whether
// this call ended it.
func (h *Hold) end(cause error) bool {
	h.w.mu.Lock()
	if h.ended {
		h.w.mu.Unlock()
		return false
	}
	h.ended = true
	_, held := h.w.holds[h]
	delete(h.w.holds, h)
	key := h.lease.RedisKey()
	if on := h.w.byKey[key]; on != nil {
		if on = slices.DeleteFunc(on, func(o *Hold) bool { return o == h }); len(on) == 0 {
			delete(h.w.byKey, key)
			h.w.notices.forget(key)
		} else {
			h.w.byKey[key] = on
		}
	}
	h.timer.Stop()
	if h.maxTimer != nil {
		h.maxTimer.Stop()
	}
	if h.stallTimer != nil {
		h.stallTimer.Stop()
	}
	if errors.Is(cause, lock.ErrLockLost) { // the work runs on, cancelled, until Finish
		h.unreturned = true
		h.w.metrics.HandlersUnreturned.Inc()
	}
	if len(h.w.holds) == 0 {
		h.w.metrics.OldestHold.Set(0)
	}
	// A long hold's end starts the notifier's linger: the loop, which may
	// sleep until a renewal far away, plans the stop from now.
	longEnded := held && h.w.notice.running() && time.Since(h.heldFrom) >= h.w.noticeAfter()
	if longEnded {
		h.w.notice.lastLong = time.Now()
	}
	h.w.mu.Unlock()
	if longEnded {
		h.w.poke()
	}

	h.cancel(cause)
	if held {
		h.w.metrics.LocksHeld.Dec()
		tracing.ObserveIn(h.span, h.w.metrics.LockHeld, time.Since(h.heldFrom).Seconds())
	}
	return true
}
