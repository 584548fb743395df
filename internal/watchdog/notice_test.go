package watchdog_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// longTTL makes the next renewal far away (10s): a loss seen sooner than that
// was seen through a server notice.
const longTTL = 30 * time.Second

// noticeRig is a rig whose watchdog listens to client-tracking notices.
func noticeRig(t *testing.T, srv *redistest.Server) *rig {
	t.Helper()
	r := newRig(t, srv.Addr, srv, watchdog.Options{})
	r.wd = watchdog.New(watchdog.Options{Metrics: r.metrics, Notifier: watchdog.Tracking(r.client, r.locker.KeyPrefix(), nil)})
	t.Cleanup(func() { _ = r.wd.Stop(context.Background()) })
	return r
}

// waitListening waits until the notifier is subscribed: a renewal of a held
// key then comes back as a notice that the watchdog expects (and ignores).
func waitListening(t *testing.T, admin *redis.Client) {
	t.Helper()
	redistest.WaitFor(t, 5*time.Second, "the tracking connection", func() bool {
		n, err := admin.PubSubNumSub(context.Background(), "__redis__:invalidate").Result()
		return err == nil && n["__redis__:invalidate"] > 0
	})
}

// waitChecked waits until the notifier listens and the check it makes of
// every lease when it subscribes has landed: renewed counts at least holds
// renewals (none fall due sooner under longTTL). A foreign write that Redis
// ran in the same event-loop iteration as one of those renewals would reach
// the watchdog as one notice with it (BCAST tracking sends a key once per
// iteration) and be taken for the renewal's own: that loss is then found at
// the next renewal, not at once. The tests of notices change a key after
// the check, as a loss mid-hold would.
func waitChecked(t *testing.T, r *rig, holds int) {
	t.Helper()
	waitListening(t, r.admin)
	redistest.WaitFor(t, 5*time.Second, "the (re)subscribe's check of every lease", func() bool {
		return testutil.ToFloat64(r.metrics.LockNotices) >= 1 &&
			testutil.ToFloat64(r.metrics.Renewals.WithLabelValues("renewed")) >= float64(holds)
	})
}

// A key deleted, overwritten or replaced under a 30s TTL (next renewal
// 10s away) cancels its holder within milliseconds; other holds stay.
func TestNoticeCancelsWithinMilliseconds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := noticeRig(t, srv)
	bg := context.Background()
	for _, c := range []struct {
		name   string
		change func(key string) error
		want   lock.Reason
	}{
		{"deleted", func(k string) error { return r.admin.Del(bg, k).Err() }, lock.ReasonExpired},
		{"overwritten", func(k string) error { return r.admin.Set(bg, k, "another-token", time.Minute).Err() }, lock.ReasonStolen},
		{"replaced", func(k string) error {
			// Gone, then taken by another holder before any renewal.
			_, err := r.admin.TxPipelined(bg, func(p redis.Pipeliner) error {
				p.Del(bg, k)
				p.Set(bg, k, "next-holder", time.Minute)
				return nil
			})
			return err
		}, lock.ReasonStolen},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, hold := holdOn(t, r.wd, r.locker, "n:"+c.name, longTTL)
			defer hold.Stop()
			other, otherHold := holdOn(t, r.wd, r.locker, "other:"+c.name, longTTL)
			defer otherHold.Stop()
			waitChecked(t, r, 2)
			changed := time.Now()
			if err := c.change(r.locker.Key("n:" + c.name)); err != nil {
				t.Fatal(err)
			}
			at, reason := cancelled(t, ctx, 2*time.Second)
			if reason != c.want {
				t.Fatalf("reason %q, want %q", reason, c.want)
			}
			latency := at.Sub(changed)
			t.Logf("%s: cancelled %v after the change (next renewal was %v away)", c.name, latency, longTTL/3)
			if latency > time.Second {
				t.Fatalf("cancelled %v after the change, want within 1s", latency)
			}
			if other.Err() != nil {
				t.Fatalf("another hold was cancelled: %v", context.Cause(other))
			}
		})
	}
}

// Notices of our own renewals (a renewal modifies the key too) cause no
// further renewals: the watchdog expects them. With short TTLs the renewal
// count stays at one per interval per lease.
func TestOwnRenewalsCauseNoExtraRenewals(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := noticeRig(t, srv)
	var holds []*watchdog.Hold
	for i := range 20 {
		ctx, h := holdOn(t, r.wd, r.locker, fmt.Sprint("own:", i), ttl)
		holds = append(holds, h)
		defer h.Stop()
		_ = ctx
	}
	waitListening(t, r.admin)
	// Past the first (re)subscribe, which checks everything once: its notice
	// is counted, and the round it makes due renews every lease.
	renewals := func() float64 { return testutil.ToFloat64(r.metrics.Renewals.WithLabelValues("renewed")) }
	redistest.WaitFor(t, 5*time.Second, "the (re)subscribe's check of every lease", func() bool {
		return testutil.ToFloat64(r.metrics.LockNotices) >= 1
	})
	checked := renewals()
	redistest.WaitFor(t, 5*time.Second, "a round of every lease after the (re)subscribe", func() bool {
		return renewals() >= checked+float64(len(holds))
	})
	before, notices, from := renewals(), testutil.ToFloat64(r.metrics.LockNotices), time.Now()
	// The window is what is measured (renewals per lease per interval), not
	// a wait for an event; its length is read back, not assumed.
	time.Sleep(2 * time.Second)
	renewed, window := renewals()-before, time.Since(from)
	// One renewal per lease per interval (ttl/3), with a margin for rounds
	// that run early (leases within a quarter interval share a round).
	perLease := renewed / float64(len(holds))
	want := float64(window) / float64(ttl/3)
	t.Logf("%.0f renewals of %d leases in %v: %.1f per lease (one interval: %.1f); unexplained notices %v",
		renewed, len(holds), window, perLease, want, testutil.ToFloat64(r.metrics.LockNotices)-notices)
	if perLease > want*1.5 {
		t.Fatalf("%.1f renewals per lease in %v, want about %.0f: notices of our own renewals feed back", perLease, window, want)
	}
	if n := testutil.ToFloat64(r.metrics.LockNotices) - notices; n > float64(len(holds)) {
		t.Fatalf("%v unexplained notices in steady state", n)
	}
	for _, h := range holds {
		if h.Lease().Err() != nil {
			t.Fatalf("a healthy lease was lost: %v", h.Lease().Err())
		}
	}
}

// A server without client tracking (the embedded miniredis) leaves renewals
// as the way a loss is found: holds work, and a deleted key is still seen at
// the next renewal.
func TestNoTrackingFallsBackToRenewals(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	defer wd.Stop(context.Background())
	ctx, hold := holdOn(t, wd, l, "m", ttl)
	defer hold.Stop()
	mr.Del(l.Key("m"))
	_, reason := cancelled(t, ctx, 2*time.Second)
	if reason != lock.ReasonExpired {
		t.Fatalf("reason %q, want expired", reason)
	}
}

// The lease is checked at use: once the local deadline has passed, the
// hold's context reports it at the first Err, Done or Cause, before the
// deadline timer has had a chance to run (as after a pause of the process).
func TestDeadlineIsCheckedAtUse(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	for _, check := range []struct {
		name string
		done func(ctx context.Context) bool
	}{
		{"Err", func(ctx context.Context) bool { return ctx.Err() != nil }},
		{"Done", func(ctx context.Context) bool {
			select {
			case <-ctx.Done():
				return true
			default:
				return false
			}
		}},
		{"Cause", func(ctx context.Context) bool { return context.Cause(ctx) != nil }},
	} {
		ctx, hold := holdOn(t, r.wd, r.locker, "use:"+check.name, longTTL)
		if check.done(ctx) {
			t.Fatalf("%s: done before the deadline", check.name)
		}
		watchdog.SetDeadline(hold, time.Now().Add(-time.Millisecond))
		if !check.done(ctx) {
			t.Fatalf("%s: not done at once after the deadline passed", check.name)
		}
		var lost *lock.LostError
		if !errors.As(context.Cause(ctx), &lost) || lost.Reason != lock.ReasonUnreachable {
			t.Fatalf("%s: cause %v, want unreachable", check.name, context.Cause(ctx))
		}
		hold.Stop()
	}
}

// Finish reports a loss the release found (the key was taken while nobody
// looked) and counts it once; a loss the watchdog found is not counted again.
func TestFinishReportsLossFoundAtRelease(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	bg := context.Background()
	_, hold := holdOn(t, r.wd, r.locker, "fin", longTTL)
	if err := r.admin.Set(bg, r.locker.Key("fin"), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	lost, err := hold.Finish(bg)
	if err != nil || lost == nil || lost.Reason != lock.ReasonStolen {
		t.Fatalf("Finish = %v, %v; want a stolen loss", lost, err)
	}
	if got := testutil.ToFloat64(r.metrics.LockLost.WithLabelValues("stolen")); got != 1 {
		t.Fatalf("lock_lost_total{stolen} = %v, want 1", got)
	}
	if v := r.admin.Get(bg, r.locker.Key("fin")).Val(); v != "someone-else" {
		t.Fatalf("release touched the next holder's lock: %q", v)
	}
	// A clean hold finishes with nothing to report and frees the key.
	_, hold = holdOn(t, r.wd, r.locker, "clean", longTTL)
	if lost, err := hold.Finish(bg); lost != nil || err != nil {
		t.Fatalf("Finish = %v, %v", lost, err)
	}
	if n := r.admin.Exists(bg, r.locker.Key("clean")).Val(); n != 0 {
		t.Fatal("the key was not released")
	}
}
