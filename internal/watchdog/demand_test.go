package watchdog_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// countedNotifier counts the runs of a Notifier and how many returned, and
// keeps when it was first run.
type countedNotifier struct {
	watchdog.Notifier
	runs, returned atomic.Int32
	first          atomic.Pointer[time.Time]
}

func (n *countedNotifier) Run(ctx context.Context, notify func([]string, bool)) {
	now := time.Now()
	n.first.CompareAndSwap(nil, &now)
	n.runs.Add(1)
	defer n.returned.Add(1)
	n.Notifier.Run(ctx, notify)
}

// demandRig is a rig whose watchdog starts its (counted) tracking notifier
// only for holds older than after, and stops it linger after the last.
func demandRig(t *testing.T, after, linger time.Duration) (*rig, *countedNotifier) {
	t.Helper()
	srv := redistest.Start(t)
	r := newRig(t, srv.Addr, srv, watchdog.Options{})
	n := &countedNotifier{Notifier: watchdog.Tracking(r.client, r.locker.KeyPrefix(), nil)}
	r.wd = watchdog.New(watchdog.Options{Metrics: r.metrics, Notifier: n, NoticeAfter: after, NoticeLinger: linger})
	t.Cleanup(func() { _ = r.wd.Stop(context.Background()) })
	return r, n
}

// Holds that end sooner than NoticeAfter never start the notifier (short
// jobs pay nothing for notices); one that lives longer starts it, a change
// of its key then cancels it at once, and NoticeLinger after the last long
// hold ended the notifier stops.
func TestNoticesRunOnlyWhileAHoldIsOld(t *testing.T) {
	t.Parallel()
	const after, linger = 300 * time.Millisecond, 400 * time.Millisecond
	r, n := demandRig(t, after, linger)
	bg := context.Background()
	// The notifier may start once some hold is NoticeAfter old: the long
	// hold below, or a short one that a loaded machine kept that long (its
	// span is measured, from before its Hold to after its Finish, so that
	// the bound follows the machine's delays rather than assume them).
	oldEnough := time.Time{}
	for i := range 50 {
		lease, err := r.locker.TryAcquire(bg, "short", longTTL)
		if err != nil {
			t.Fatal(i, err)
		}
		from := time.Now()
		_, hold := r.wd.Hold(bg, lease)
		if _, err := hold.Finish(bg); err != nil {
			t.Fatal(err)
		}
		if time.Since(from) >= after && oldEnough.IsZero() {
			oldEnough = from.Add(after)
			t.Logf("short hold %d lasted %v, longer than NoticeAfter %v: the notifier may start for it", i, time.Since(from), after)
		}
	}

	longFrom := time.Now()
	ctx, hold := holdOn(t, r.wd, r.locker, "long", longTTL)
	defer hold.Stop()
	if oldEnough.IsZero() {
		oldEnough = longFrom.Add(after)
	}
	redistest.WaitFor(t, 5*time.Second, "the notifier to start for a hold older than NoticeAfter", func() bool { return n.runs.Load() == 1 })
	if first := *n.first.Load(); first.Before(oldEnough) {
		t.Fatalf("notifier started %v before any hold was NoticeAfter (%v) old", oldEnough.Sub(first), after)
	}
	waitChecked(t, r, 1)
	changed := time.Now()
	if err := r.admin.Del(bg, r.locker.Key("long")).Err(); err != nil {
		t.Fatal(err)
	}
	at, reason := cancelled(t, ctx, 2*time.Second)
	if reason != lock.ReasonExpired || at.Sub(changed) > time.Second {
		t.Fatalf("cancelled %v after the change, reason %q; want within 1s (next renewal %v away), expired", at.Sub(changed), reason, longTTL/3)
	}
	// The hold ended after the change: the linger counts from then.
	redistest.WaitFor(t, 5*time.Second, "the notifier to stop after NoticeLinger", func() bool { return n.returned.Load() == 1 })
	if d := time.Since(changed); d < linger {
		t.Fatalf("notifier stopped %v after the change that ended the last long hold, want NoticeLinger %v after its end", d, linger)
	}
	if got := n.runs.Load(); got != 1 {
		t.Fatalf("notifier started %d times, want 1", got)
	}

	// A long hold that ends by its release (no renewal or loss wakes the
	// watchdog then; its next renewal is 10s away): the notifier stops
	// NoticeLinger after that end, not at the next renewal.
	_, hold2 := holdOn(t, r.wd, r.locker, "long2", longTTL)
	redistest.WaitFor(t, 5*time.Second, "the notifier to start again", func() bool { return n.runs.Load() == 2 })
	releasing := time.Now() // the linger counts from within Finish
	if _, err := hold2.Finish(bg); err != nil {
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, "the notifier to stop NoticeLinger after the release", func() bool { return n.returned.Load() == 2 })
	if d := time.Since(releasing); d < linger || d > linger+time.Second {
		t.Fatalf("notifier stopped %v after the release, want NoticeLinger %v", d, linger)
	}
}

// A loss in a hold's first NoticeAfter, before any notifier runs, is found
// when the notifier starts (it checks every lease), long before the next
// renewal.
func TestLossOfAYoungHoldIsFoundWhenNoticesStart(t *testing.T) {
	t.Parallel()
	const after = 300 * time.Millisecond
	r, n := demandRig(t, after, time.Second)
	ctx, hold := holdOn(t, r.wd, r.locker, "young", longTTL)
	defer hold.Stop()
	changed := time.Now()
	if err := r.admin.Del(context.Background(), r.locker.Key("young")).Err(); err != nil {
		t.Fatal(err)
	}
	if n.runs.Load() != 0 {
		t.Fatal("notifier already running for a hold younger than NoticeAfter")
	}
	at, reason := cancelled(t, ctx, 5*time.Second)
	latency := at.Sub(changed)
	t.Logf("a loss at age 0 found %v later (NoticeAfter %v, next renewal %v away)", latency, after, longTTL/3)
	if reason != lock.ReasonExpired || latency > after+2*time.Second {
		t.Fatalf("found %v after the change (reason %q), want by NoticeAfter %v plus a round trip", latency, reason, after)
	}
}

// A server that refuses notices is asked once: the notifier that returned
// on its own is not started again for later long holds.
func TestRefusedNoticesAreNotRetriedPerHold(t *testing.T) {
	t.Parallel()
	r := startRig(t, watchdog.Options{})
	const after = 20 * time.Millisecond
	refused := &countedNotifier{Notifier: refusing{}}
	r.wd = watchdog.New(watchdog.Options{Metrics: r.metrics, Notifier: refused, NoticeAfter: after, NoticeLinger: after})
	t.Cleanup(func() { _ = r.wd.Stop(context.Background()) })
	for i := range 3 {
		_, hold := holdOn(t, r.wd, r.locker, fmt.Sprint("refused:", i), longTTL)
		redistest.WaitFor(t, 5*time.Second, "the notifier to be tried", func() bool { return refused.returned.Load() == 1 })
		time.Sleep(3 * after) // the hold stays old: a retrying watchdog would start it again
		hold.Stop()
		if got := refused.runs.Load(); got != 1 {
			t.Fatalf("hold %d: refused notifier run %d times, want once", i, got)
		}
	}
}

// refusing is a Notifier whose server cannot send notices: it returns at once.
type refusing struct{}

func (refusing) Run(context.Context, func([]string, bool)) {}
