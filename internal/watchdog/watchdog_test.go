package watchdog_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

func TestHealthyLeaseIsRenewedAndNeverCancelled(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	ctx, hold := r.hold(t, "r")
	select {
	case <-ctx.Done():
		t.Fatalf("cancelled while Redis was healthy: %v", context.Cause(ctx))
	case <-time.After(10 * ttl):
	}
	renewed := testutil.ToFloat64(r.metrics.Renewals.WithLabelValues(metrics.RenewalRenewed))
	// 10 × ttl at ttl/3 is 30 intervals; rounds may run up to a quarter early,
	// or late on a loaded machine, but each must come before the deadline.
	if renewed < 20 || renewed > 40 {
		t.Fatalf("%v renewals in 10×ttl, want about 30", renewed)
	}
	var last time.Time
	for _, tr := range r.rec.snapshot() {
		if tr.evals == 0 || tr.err != nil {
			continue
		}
		if !last.IsZero() && tr.sent.Sub(last) >= ttl-drift {
			t.Fatalf("%v between two renewals: the local deadline (ttl − drift = %v) would have passed",
				tr.sent.Sub(last), ttl-drift)
		}
		last = tr.sent
	}
	if got := testutil.ToFloat64(r.metrics.LocksHeld); got != 1 {
		t.Fatalf("locks_held = %v, want 1", got)
	}
	if lost, err := hold.Finish(context.Background()); err != nil || lost != nil {
		t.Fatal(err, lost)
	}
	if n := r.admin.Exists(context.Background(), r.locker.Key("r")).Val(); n != 0 {
		t.Fatal("Release left the lock key")
	}
	if got := testutil.ToFloat64(r.metrics.LocksHeld); got != 0 {
		t.Fatalf("locks_held after release = %v, want 0", got)
	}
	if ctx.Err() == nil {
		t.Fatal("the hold's context is still live after Release")
	}
}

// A key deleted or overwritten behind the holder's back is a loss with its
// reason (expired, stolen), seen within one renewal interval and counted
// once; no renewal of ours touches the key after it.
func TestKeyChangedCancelsWithItsReason(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	for _, tc := range []struct {
		reason lock.Reason
		fault  func(r *rig, key string) error
		// after checks the key a full interval after the loss.
		after func(t *testing.T, r *rig, key string, faulted time.Time)
	}{
		{
			reason: lock.ReasonExpired,
			fault:  func(r *rig, key string) error { return r.admin.Del(bg, key).Err() },
			after: func(t *testing.T, r *rig, key string, _ time.Time) {
				if n := r.admin.Exists(bg, key).Val(); n != 0 {
					t.Fatal("the deleted key is back")
				}
			},
		},
		{
			reason: lock.ReasonStolen,
			fault:  func(r *rig, key string) error { return r.admin.Set(bg, key, "other-holder", 5*time.Second).Err() },
			after: func(t *testing.T, r *rig, key string, stolen time.Time) {
				// The SET ran before stolen and the PTTL after asked: left
				// alone, the TTL is at most 5s − (asked − stolen), plus
				// Redis's rounding to the millisecond.
				asked := time.Now()
				pttl := r.admin.PTTL(bg, key).Val()
				if got := r.admin.Get(bg, key).Val(); got != "other-holder" {
					t.Fatalf("key holds %q, want the other holder's token", got)
				}
				if want := 5*time.Second - asked.Sub(stolen) + time.Millisecond; pttl > want {
					t.Fatalf("other token's PTTL %v > %v: it was extended", pttl, want)
				}
			},
		},
	} {
		t.Run(string(tc.reason), func(t *testing.T) {
			t.Parallel()
			r := startRig(t, watchdog.Options{})
			late := proctest.MeasureLateness(t)
			ctx, hold := r.hold(t, "r")
			defer hold.Stop()
			key := r.locker.Key("r")
			if err := tc.fault(r, key); err != nil {
				t.Fatal(err)
			}
			faulted := time.Now()
			at, reason := cancelled(t, ctx, 2*time.Second)
			if reason != tc.reason {
				t.Fatalf("reason %q, want %s", reason, tc.reason)
			}
			latency := at.Sub(faulted)
			t.Logf("%s: cancelled %v after the fault (interval %v)", tc.reason, latency, ttl/3)
			if bound := ttl/3 + slack + late.Max(); latency > bound {
				t.Fatalf("cancelled %v after the fault, want within one interval (%v) + %v + the timers' measured lateness %v", latency, ttl/3, slack, late.Max())
			}
			if got := testutil.ToFloat64(r.metrics.LockLost.WithLabelValues(string(tc.reason))); got != 1 {
				t.Fatalf("lock_lost_total{reason=%s} = %v", tc.reason, got)
			}
			// Observe a full interval more: no renewal of ours may touch the key.
			tripsAtCancel := len(r.rec.snapshot())
			time.Sleep(ttl / 2)
			tc.after(t, r, key, faulted)
			if n := len(r.rec.snapshot()) - tripsAtCancel; n != 0 {
				t.Fatalf("%d round trips after the loss, want none", n)
			}
		})
	}
}

// assertDeadline checks the cancellation came before the last successful
// renewal's send time + ttl, and that no renewal was sent after it.
//
// The deadline timer fires ttl − drift after that send; a machine that
// schedules the process late fires it late, and the test sees the
// cancellation later still. The expiry is then compared with the time the
// cancellation was seen less the lateness of the test's own timers over the
// same stretch (late): what the machine delayed, not what the watchdog did.
func assertDeadline(t *testing.T, r *rig, at time.Time, late time.Duration, label string) {
	t.Helper()
	last := r.rec.lastOKSend(at)
	if last.IsZero() {
		t.Fatal("no successful renewal recorded")
	}
	margin := last.Add(ttl).Sub(at)
	t.Logf("%s: cancelled %v after the last successful renewal was sent; %v before its expiry (ttl %v; timers late by up to %v)",
		label, at.Sub(last), margin, ttl, late)
	if margin+late <= 0 {
		t.Fatalf("cancelled %v after last-renewal-send + ttl, more than the timers' measured lateness %v: another holder could have had the lock", -margin, late)
	}
	for _, tr := range r.rec.snapshot() {
		if tr.evals > 0 && tr.sent.After(at) {
			t.Fatalf("a renewal was sent %v after the cancellation", tr.sent.Sub(at))
		}
	}
}

// Redis paused (SIGSTOP), killed, or the connection black-holed: the lease
// is cancelled (unreachable) before the last renewal's send time + ttl, and
// no renewal is sent after that, also once Redis answers again.
func TestUnreachableRedisCancelsBeforeTheLeaseExpires(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		proxied bool
		// fault breaks the path to Redis and returns how to heal it (nil: it stays broken).
		fault func(srv *redistest.Server, proxy *redistest.Proxy) (heal func())
	}{
		{"paused", false, func(srv *redistest.Server, _ *redistest.Proxy) func() { srv.Pause(); return srv.Resume }},
		{"killed", false, func(srv *redistest.Server, _ *redistest.Proxy) func() { srv.Kill(); return nil }},
		{"black-holed", true, func(_ *redistest.Server, p *redistest.Proxy) func() { p.Blackhole(); return p.Restore }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			addr, proxy := srv.Addr, (*redistest.Proxy)(nil)
			if tc.proxied {
				proxy = redistest.StartProxy(t, srv.Addr)
				addr = proxy.Addr
			}
			r := newRig(t, addr, srv, watchdog.Options{})
			late := proctest.MeasureLateness(t)
			// A healthy lease first, renewed 3 times. A machine that starves
			// Redis past the short ttl loses it before any fault (rightly):
			// that is not the fault under test, so a fresh lease is taken,
			// a bounded number of times.
			var ctx context.Context
			renewed := func() float64 { return testutil.ToFloat64(r.metrics.Renewals.WithLabelValues(metrics.RenewalRenewed)) }
			for attempt := 1; ; attempt++ {
				var hold *watchdog.Hold
				ctx, hold = r.hold(t, fmt.Sprint("r", attempt))
				defer hold.Stop()
				from := renewed()
				waitFor(t, 5*time.Second, "3 renewals or the lease's loss", func() bool { return renewed() >= from+3 || ctx.Err() != nil })
				if ctx.Err() == nil {
					break
				}
				if attempt == 3 {
					t.Fatalf("3 leases in a row lost before any fault: %v", context.Cause(ctx))
				}
				t.Logf("lease %d lost before the fault on this loaded machine (%v): taking another", attempt, context.Cause(ctx))
			}
			faulted := time.Now()
			heal := tc.fault(srv, proxy)
			at, reason := cancelled(t, ctx, 2*ttl)
			if reason != lock.ReasonUnreachable {
				t.Fatalf("reason %q, want unreachable", reason)
			}
			assertDeadline(t, r, at, late.Max(), tc.name)
			// The failed round ends at its deadline, when the deadline timer
			// cancels: its error is counted a moment after the cancellation.
			waitFor(t, time.Second, "renewals_total{result=error} to count the failed renewal", func() bool {
				return testutil.ToFloat64(r.metrics.Renewals.WithLabelValues(metrics.RenewalError)) >= 1
			})
			if heal == nil {
				return
			}
			// Keep the fault for 2 × ttl, then heal it: Redis answers again,
			// and the lost lease is still never renewed.
			time.Sleep(time.Until(faulted.Add(2 * ttl)))
			heal()
			if err := r.admin.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			trips := len(r.rec.snapshot())
			time.Sleep(ttl / 2)
			if n := len(r.rec.snapshot()) - trips; n != 0 {
				t.Fatalf("%d round trips after Redis answered again, want none", n)
			}
		})
	}
}

func TestMaxHoldCancelsAndReleaseFreesTheKey(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	start := time.Now()
	ctx, hold := r.hold(t, "r", watchdog.MaxHold(2*ttl))
	at, reason := cancelled(t, ctx, 4*ttl)
	if reason != lock.ReasonMaxHold {
		t.Fatalf("reason %q, want max_hold", reason)
	}
	if d := at.Sub(start); d < 2*ttl-10*time.Millisecond {
		t.Fatalf("cancelled after %v, before the max hold %v", d, 2*ttl)
	}
	if lost, err := hold.Finish(context.Background()); err != nil || lost == nil || lost.Reason != lock.ReasonMaxHold {
		t.Fatalf("Finish after max hold: %v, lost %v; want the loss reported", err, lost)
	}
	if n := r.admin.Exists(context.Background(), r.locker.Key("r")).Val(); n != 0 {
		t.Fatal("Release after max hold left our key in Redis")
	}
}

func TestPanicInOneRenewalDoesNotStopOthers(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	watchdog.SetTestHookRenew(r.wd, func(l *lock.Lease) {
		if l.Key() == "bad" {
			panic("injected")
		}
	})
	badCtx, bad := r.hold(t, "bad")
	defer bad.Stop()
	goodCtx, good := r.hold(t, "good")
	defer good.Stop()
	select {
	case <-goodCtx.Done():
		t.Fatalf("healthy lease cancelled: %v", context.Cause(goodCtx))
	case <-time.After(5 * ttl):
	}
	if got := testutil.ToFloat64(r.metrics.Renewals.WithLabelValues(metrics.RenewalPanic)); got < 1 {
		t.Fatalf("renewals_total{result=panic} = %v, want the panics counted", got)
	}
	// The lease that always panics is never renewed, so its deadline passes.
	if _, reason := cancelled(t, badCtx, time.Second); reason != lock.ReasonUnreachable {
		t.Fatalf("panicking lease: reason %q, want unreachable", reason)
	}
}

// Not parallel: its 10,000 leases take the machine for seconds (under
// -race, with a CPU hog beside it, past the deadline of the 300ms leases of
// every other test), so it runs alone, before the parallel tests start.
func TestTenThousandLeasesFewRoundTrips(t *testing.T) {
	const n = 10_000
	// What is claimed is round trips per round, not the pace of a round:
	// the ttl leaves a round of 10,000 renewals under -race, beside other
	// work on two cores, well over a second to end before a lease expires
	// (2 s lost 87 leases beside a CPU hog at load 12, 4 s lost 4 at load
	// 15 with the timers on time).
	const longTTL = 8 * time.Second // interval ~2.67s
	r := startRig(t, watchdog.Options{})
	late := proctest.MeasureLateness(t)
	bg := context.Background()
	var lost atomic.Int32
	var causesMu sync.Mutex
	causes := map[string]int{} // the lost leases' causes, for a failure
	holds := make([]*watchdog.Hold, n)
	ctxs := make([]context.Context, n)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				lease, err := r.locker.TryAcquire(bg, fmt.Sprintf("bulk-%d", i), longTTL)
				if err != nil {
					errs <- err
					return
				}
				ctxs[i], holds[i] = r.wd.Hold(bg, lease)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	defer func() {
		for _, h := range holds {
			h.Stop()
		}
	}()
	for i := range ctxs {
		context.AfterFunc(ctxs[i], func() {
			lost.Add(1)
			causesMu.Lock()
			causes[fmt.Sprint(context.Cause(ctxs[i]))]++
			causesMu.Unlock()
		})
	}
	// The acquires were spread over time (a second or more under -race on
	// a loaded machine), so the first renewals of each lease fall due in
	// several rounds; a lease renewed in a round falls due again with the
	// others of that round. Count from when every lease was renewed once:
	// the steady state, where the claim is that a round is one pipeline.
	renewed := func() float64 { return testutil.ToFloat64(r.metrics.Renewals.WithLabelValues(metrics.RenewalRenewed)) }
	waitFor(t, 2*longTTL, "every lease renewed once", func() bool { return renewed() >= n })
	before := len(r.rec.snapshot())
	renewedBefore := renewed()
	const rounds = 4
	// Each round must come within a ttl of the one before, or its leases
	// are lost anyway: that, not a guess at the machine's pace, bounds
	// each wait.
	for k := 1; k <= rounds; k++ {
		waitFor(t, longTTL, fmt.Sprintf("renewal round %d of %d", k, rounds), func() bool {
			return renewed()-renewedBefore >= float64(k*n) || lost.Load() != 0
		})
		if lost.Load() != 0 {
			break
		}
	}
	trips := r.rec.snapshot()[before:]
	if lost.Load() != 0 {
		causesMu.Lock()
		defer causesMu.Unlock()
		t.Fatalf("%d leases cancelled while Redis was healthy (causes %v; the timers' measured lateness %v)", lost.Load(), causes, late.Max())
	}
	// Every round sends the leases in one pipeline; a round may still split
	// in two, but never anything near one trip per lease.
	perRound := float64(len(trips)) / rounds
	t.Logf("%d leases: %d round trips over %d renewal rounds (%.1f per round)", n, len(trips), rounds, perRound)
	if perRound > 4 {
		t.Fatalf("%.1f round trips per renewal round for %d leases, want a small constant", perRound, n)
	}
	for _, k := range []int{0, n / 2, n - 1} {
		if pttl := r.admin.PTTL(bg, r.locker.Key(fmt.Sprintf("bulk-%d", k))).Val(); pttl < longTTL/2 {
			t.Fatalf("bulk-%d PTTL %v: not being renewed", k, pttl)
		}
	}
}

func TestStopCancelsOpenHolds(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	ctx, _ := r.hold(t, "r")
	if err := r.wd.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(ctx), watchdog.ErrStopped) {
		t.Fatalf("cause after Stop: %v, want ErrStopped", context.Cause(ctx))
	}
	lease, err := r.locker.TryAcquire(context.Background(), "late", ttl)
	if err != nil {
		t.Fatal(err)
	}
	late, _ := r.wd.Hold(context.Background(), lease)
	if !errors.Is(context.Cause(late), watchdog.ErrStopped) {
		t.Fatalf("Hold after Stop: cause %v, want ErrStopped", context.Cause(late))
	}
}

// A watchdog stopped before it ever started (no Start, no Hold) refuses
// later holds: their contexts end at once with ErrStopped, and no loop starts.
func TestStopBeforeStartRefusesHolds(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	if err := r.wd.Stop(context.Background()); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	ctx, h := r.hold(t, "never")
	if !errors.Is(context.Cause(ctx), watchdog.ErrStopped) {
		t.Fatalf("Hold after Stop before Start: cause %v, want ErrStopped", context.Cause(ctx))
	}
	h.Stop()
	if n := r.wd.Held(); n != 0 {
		t.Fatalf("Held() = %d after a refused hold", n)
	}
	if err := r.wd.Start(context.Background()); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
}

// waitFor waits for an observable condition (see redistest.WaitFor).
var waitFor = redistest.WaitFor

// A loss the watchdog finds while the work is returning (its hold already
// ended, Finish about to release) is counted once: not dropped because the
// hold ended first, and not counted again at release.
func TestLossFoundAsTheWorkReturnsIsCountedOnce(t *testing.T) {
	r := startRig(t, watchdog.Options{})
	_, hold := r.hold(t, "race")
	if err := r.admin.Set(context.Background(), "lockstep:{race}", "another-holder", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	hold.Stop()                                    // the work returned: the hold ends
	watchdog.Lose(hold, lock.ReasonStolen)         // a renewal in flight finds the key taken
	lost, err := hold.Finish(context.Background()) // the release finds it taken too
	if err != nil || lost == nil || lost.Reason != lock.ReasonStolen {
		t.Fatalf("Finish = %v, %v; want the stolen loss", lost, err)
	}
	if got := testutil.ToFloat64(r.metrics.LockLost.WithLabelValues("stolen")); got != 1 {
		t.Fatalf("lock_lost_total{stolen} = %v, want 1", got)
	}
}
