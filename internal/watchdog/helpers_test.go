package watchdog_test

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

// ttl is short so fault tests run fast: interval 100ms, and a drift margin of
// 75ms leaves room for a loaded 2-core CI machine to fire the deadline timer.
const (
	ttl   = 300 * time.Millisecond
	drift = 75 * time.Millisecond
	// slack is how late, beyond what the design allows, a cancellation may be
	// observed on a loaded machine.
	slack = 100 * time.Millisecond
)

// recorder is a go-redis hook that logs when each round trip was sent and
// whether it succeeded, so tests can read the last successful renewal's send
// time and count round trips.
type recorder struct {
	mu    sync.Mutex
	trips []trip
}

type trip struct {
	sent, done time.Time
	cmds       int
	evals      int // EVALSHA/EVAL commands in it
	err        error
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t := trip{sent: time.Now(), cmds: 1, evals: countEvals(cmd)}
		err := next(ctx, cmd)
		t.done, t.err = time.Now(), err
		r.add(t)
		return err
	}
}

func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t := trip{sent: time.Now(), cmds: len(cmds), evals: countEvals(cmds...)}
		err := next(ctx, cmds)
		for _, c := range cmds {
			if err == nil {
				err = c.Err()
			}
		}
		t.done, t.err = time.Now(), err
		r.add(t)
		return err
	}
}

func countEvals(cmds ...redis.Cmder) int {
	n := 0
	for _, c := range cmds {
		if name := c.Name(); name == "evalsha" || name == "eval" {
			n++
		}
	}
	return n
}

func (r *recorder) add(t trip) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, t)
}

func (r *recorder) snapshot() []trip {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]trip(nil), r.trips...)
}

// lastOKSend is the send time of the last round trip that succeeded before t.
func (r *recorder) lastOKSend(before time.Time) time.Time {
	var last time.Time
	for _, t := range r.snapshot() {
		if t.err == nil && t.done.Before(before) && t.sent.After(last) {
			last = t.sent
		}
	}
	return last
}

type rig struct {
	srv     *redistest.Server
	client  *redis.Client // the watchdog's, through rec
	admin   *redis.Client // another client, for the test's own commands
	rec     *recorder
	locker  *lock.Locker
	wd      *watchdog.Watchdog
	metrics *metrics.Metrics
}

func newRig(t *testing.T, addr string, srv *redistest.Server, opts watchdog.Options) *rig {
	t.Helper()
	rec := &recorder{}
	c := redis.NewClient(&redis.Options{
		// A round's context ends at its earliest deadline, which bounds
		// a dial too: a dial timeout shorter than that (it was 100ms) lost
		// healthy leases on a loaded machine, whose Redis accepted late.
		Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: ttl, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	c.AddHook(rec)
	t.Cleanup(func() { c.Close() })
	m := metrics.New(nil)
	opts.Metrics = m
	opts.DriftMargin = cmp.Or(opts.DriftMargin, drift)
	wd := watchdog.New(opts)
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	return &rig{srv: srv, client: c, admin: srv.Client(), rec: rec, locker: lock.New(c), wd: wd, metrics: m}
}

// startRig is newRig on a Redis server of its own.
func startRig(t *testing.T, opts watchdog.Options) *rig {
	t.Helper()
	srv := redistest.Start(t)
	return newRig(t, srv.Addr, srv, opts)
}

// hold holds resource for ttl under the rig's watchdog.
func (r *rig) hold(t *testing.T, resource string, opts ...watchdog.HoldOption) (context.Context, *watchdog.Hold) {
	t.Helper()
	return holdOn(t, r.wd, r.locker, resource, ttl, opts...)
}

// holdOn acquires resource on l for ttl and hands the lease to wd.
func holdOn(t *testing.T, wd *watchdog.Watchdog, l *lock.Locker, resource string, ttl time.Duration, opts ...watchdog.HoldOption) (context.Context, *watchdog.Hold) {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), resource, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return wd.Hold(context.Background(), lease, opts...)
}

// cancelled waits for ctx to be cancelled and returns when and the lost reason.
func cancelled(t *testing.T, ctx context.Context, within time.Duration) (time.Time, lock.Reason) {
	t.Helper()
	redistest.Receive(t, ctx.Done(), within, "the context's cancellation")
	at := time.Now()
	var lost *lock.LostError
	cause := context.Cause(ctx)
	if !errors.As(cause, &lost) || !errors.Is(cause, lock.ErrLockLost) {
		t.Fatalf("cause %v, want a *lock.LostError matching lock.ErrLockLost", cause)
	}
	return at, lost.Reason
}
