package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Short leases keep the fault tests fast: the watchdog renews every 100ms
// and trusts a lease until last renewal + 300ms − 75ms.
const (
	wdTTL   = 300 * time.Millisecond
	wdDrift = 75 * time.Millisecond
)

func newWatchdog(t *testing.T) (*watchdog.Watchdog, *metrics.Metrics) {
	m := metrics.New(nil)
	wd := watchdog.New(watchdog.Options{DriftMargin: wdDrift, Metrics: m})
	t.Cleanup(func() { _ = wd.Stop(context.Background()) })
	return wd, m
}

// watched acquires resource on l for ttl and hands the lease to wd; the hold
// stops when the test ends.
func watched(t *testing.T, wd *watchdog.Watchdog, l *lock.Locker, resource string, ttl time.Duration) (*lock.Lease, context.Context, *watchdog.Hold) {
	t.Helper()
	lease := mustAcquire(t, context.Background(), l, resource, ttl)
	hctx, hold := wd.Hold(context.Background(), lease)
	t.Cleanup(hold.Stop)
	return lease, hctx, hold
}

func renewed(m *metrics.Metrics) float64 {
	return testutil.ToFloat64(m.Renewals.WithLabelValues(metrics.RenewalRenewed))
}

// lostWithin waits for ctx's cancellation and returns when and the reason.
func lostWithin(t *testing.T, ctx context.Context, within time.Duration) (time.Time, lock.Reason) {
	t.Helper()
	redistest.Receive(t, ctx.Done(), within, "the context's cancellation")
	at := time.Now()
	var lost *lock.LostError
	if cause := context.Cause(ctx); !errors.As(cause, &lost) {
		t.Fatalf("cause %v, want a *lock.LostError", cause)
	}
	return at, lost.Reason
}

// redlockRig is Redlock over five fresh masters, with a watchdog for the
// short test leases (see newWatchdog).
type redlockRig struct {
	servers []*redistest.Server
	clients []redis.UniversalClient
	l       *lock.Locker
	wd      *watchdog.Watchdog
	m       *metrics.Metrics
}

func newRedlockRig(t *testing.T) *redlockRig {
	r := &redlockRig{}
	r.servers, r.clients = redlockNodes(t, 5)
	r.l = lock.NewRedlock(r.clients)
	r.wd, r.m = newWatchdog(t)
	return r
}

func TestRedlockKillTwoOfFiveStillAcquiresAndRenews(t *testing.T) {
	t.Parallel()
	r := newRedlockRig(t)
	ctx := context.Background()
	// A 1s lease (300ms lost one under a load of 7: a renewal round did
	// not land within its 225ms while two nodes were dead).
	const ttl = time.Second
	lease, hctx, hold := watched(t, r.wd, r.l, "held", ttl)
	eventually(t, 3*time.Second, "3 renewals", func() bool { return renewed(r.m) >= 3 })

	r.servers[0].Kill()
	r.servers[3].Kill()
	before := renewed(r.m)
	select {
	case <-hctx.Done():
		t.Fatalf("lease lost with 3 of 5 nodes up: %v", context.Cause(hctx))
	case <-time.After(4 * ttl):
	}
	// 4 × ttl at ttl/3 is 12 intervals; rounds may run up to a quarter early.
	if n := renewed(r.m) - before; n < 10 {
		t.Fatalf("%v renewals in 4×ttl with 3 of 5 nodes up, want about 12", n)
	}
	live := []redis.UniversalClient{r.clients[1], r.clients[2], r.clients[4]}
	for i, c := range live {
		if pttl := c.PTTL(ctx, lease.RedisKey()).Val(); pttl < ttl/2 {
			t.Fatalf("live node %d: PTTL %v, the lease is not being renewed", i, pttl)
		}
	}

	start := time.Now()
	fresh, err := r.l.TryAcquire(ctx, "fresh", wdTTL)
	if err != nil {
		t.Fatalf("acquire with 3 of 5 nodes up: %v", err)
	}
	t.Logf("acquire with 2 of 5 nodes dead took %v", time.Since(start))
	if fresh.Fence() <= 0 {
		t.Fatalf("fence %d", fresh.Fence())
	}
	if err := fresh.Release(ctx); err != nil {
		t.Fatalf("release with 3 of 5 nodes up: %v", err)
	}

	// No overlap under contention with two nodes down.
	checkContention(t, deployment{
		locker: func(opts ...lock.Option) *lock.Locker { return lock.NewRedlock(r.clients, opts...) },
		admin:  live,
	}, 4, 25)

	if lost, err := hold.Finish(ctx); err != nil || lost != nil {
		t.Fatalf("release of the held lease: %v, lost %v", err, lost)
	}
	for i, c := range live {
		if c.Exists(ctx, lease.RedisKey()).Val() != 0 {
			t.Fatalf("live node %d kept the released lock", i)
		}
	}
}

func TestRedlockKillThreeOfFiveCancelsHoldersAndRefusesAcquires(t *testing.T) {
	t.Parallel()
	r := newRedlockRig(t)
	ctx := context.Background()

	var ctxs []context.Context
	var leases []*lock.Lease
	for _, res := range []string{"a", "b"} {
		// The setup's acquires, before any fault, may time out on a loaded
		// machine (each node gets 50 ms of a 300 ms lease; three overran it
		// at once in make test): they are tried again, a few times.
		var lease *lock.Lease
		for try := 0; lease == nil; try++ {
			var err error
			if lease, err = r.l.TryAcquire(ctx, res, wdTTL); err != nil && try == 4 {
				t.Fatalf("acquire %q before any fault, 5 tries: %v", res, err)
			}
		}
		hctx, hold := r.wd.Hold(context.Background(), lease)
		t.Cleanup(hold.Stop)
		ctxs, leases = append(ctxs, hctx), append(leases, lease)
	}
	eventually(t, time.Second, "3 renewals", func() bool { return renewed(r.m) >= 6 })

	late := proctest.MeasureLateness(t)
	for _, i := range []int{0, 2, 4} {
		r.servers[i].Kill()
	}
	killed := time.Now()
	for i, hctx := range ctxs {
		at, reason := lostWithin(t, hctx, 2*wdTTL)
		t.Logf("lease %s: cancelled %v after 3 of 5 nodes were killed, reason %s", leases[i].Key(), at.Sub(killed), reason)
		if reason != lock.ReasonUnreachable && reason != lock.ReasonQuorumLost {
			t.Fatalf("reason %s, want unreachable or quorum_lost", reason)
		}
		// The last renewal that reached a quorum was sent before the kill,
		// so the lease could not outlive kill + ttl anywhere: the deadline
		// timer fires before that, late only by what this machine's
		// scheduling adds (measured).
		if d := at.Sub(killed); d >= wdTTL+late.Max() {
			t.Fatalf("cancelled %v after the kill, not before the ttl (%v) + the timers' measured lateness %v", d, wdTTL, late.Max())
		}
		if err := leases[i].Release(ctx); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Release after the loss: %v, want the loss", err)
		}
	}

	_, err := r.l.TryAcquire(ctx, "c", wdTTL)
	if err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("acquire with 2 of 5 nodes up: %v, want a transport error", err)
	}
	if !strings.Contains(err.Error(), "3 of 5 nodes failed, quorum 3") {
		t.Fatalf("error %q does not say the quorum failed", err)
	}

	// The nodes come back empty: fences still go up (fresh counters start
	// at the servers' clocks) and the lock can be taken again.
	for _, i := range []int{0, 2, 4} {
		r.servers[i].Restart()
	}
	eventually(t, 5*time.Second, "an acquire after the restart", func() bool {
		lease, err := r.l.TryAcquire(ctx, "a", wdTTL)
		if err != nil {
			return false
		}
		if lease.Fence() <= leases[0].Fence() {
			t.Fatalf("fence after the restart %d <= %d", lease.Fence(), leases[0].Fence())
		}
		return true
	})
}

func TestRedlockTokenGoneFromMajorityIsQuorumLost(t *testing.T) {
	t.Parallel()
	r := newRedlockRig(t)
	ctx := context.Background()
	lease, hctx, _ := watched(t, r.wd, r.l, "r", wdTTL)
	for _, c := range r.clients[:2] {
		if err := c.Del(ctx, lease.RedisKey()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before := renewed(r.m)
	eventually(t, time.Second, "3 renewals with the token gone from 2 of 5 nodes", func() bool {
		return renewed(r.m)-before >= 3
	})
	if hctx.Err() != nil {
		t.Fatalf("lease lost with its token on 3 of 5 nodes: %v", context.Cause(hctx))
	}

	if err := r.clients[2].Set(ctx, lease.RedisKey(), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	at, reason := lostWithin(t, hctx, 2*time.Second)
	if reason != lock.ReasonQuorumLost {
		t.Fatalf("reason %s, want quorum_lost", reason)
	}
	if d := at.Sub(gone); d > wdTTL/3+100*time.Millisecond {
		t.Fatalf("cancelled %v after the token left a majority, want within one interval", d)
	}
	if got := r.clients[2].Get(ctx, lease.RedisKey()).Val(); got != "someone-else" {
		t.Fatalf("the other token was touched: %q", got)
	}
}

// Each node has its own counter. The fence is the highest among the nodes
// that granted the lease, and those nodes' counters are lifted to it, so a
// later holder, whose majority shares a node with them, gets a greater fence
// even when the node that was ahead is not in its majority.
func TestRedlockFenceIncreasesAcrossDisjointMajorities(t *testing.T) {
	t.Parallel()
	_, clients := redlockNodes(t, 5)
	l := lock.NewRedlock(clients)
	ctx := context.Background()
	key, fence := l.Key("r"), l.FenceKey("r")
	block := func(nodes ...int) {
		for _, i := range nodes {
			if err := clients[i].Set(ctx, key, "someone-else", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	unblock := func(nodes ...int) {
		for _, i := range nodes {
			if err := clients[i].Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	counters := func() []int64 {
		out := make([]int64, len(clients))
		for i, c := range clients {
			out[i], _ = c.Get(ctx, fence).Int64()
		}
		return out
	}
	// Counters far ahead of the nodes' clocks (fences start from TIME), node 0
	// further than the others.
	base := time.Now().Add(24 * time.Hour).UnixMicro()
	if err := clients[0].Set(ctx, fence, base+5000, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients[1:] {
		if err := c.Set(ctx, fence, base+10, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}

	block(3, 4)
	x := mustAcquire(t, ctx, l, "r", time.Minute)
	if x.Fence() != base+5001 {
		t.Fatalf("fence %d, want base+5001 (node 0 was ahead)", x.Fence())
	}
	if got := counters(); got[1] != base+5001 || got[2] != base+5001 || got[3] != base+10 {
		t.Fatalf("counters %v: want nodes 1 and 2 lifted to base+5001, node 3 (busy) untouched", got)
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}

	unblock(3, 4)
	block(0)
	y := mustAcquire(t, ctx, l, "r", time.Minute)
	if y.Fence() <= x.Fence() {
		t.Fatalf("fence %d after %d from a majority without the node that was ahead", y.Fence(), x.Fence())
	}
	// A quorum of the granting nodes is at the fence (a grant that came in
	// after the decision may be left behind: later acquires lift it).
	atFence := 0
	got := counters()
	for _, c := range got[1:] {
		if c == y.Fence() {
			atFence++
		}
	}
	if atFence < 3 {
		t.Fatalf("counters %v: want a quorum of nodes 1-4 lifted to %d", got, y.Fence())
	}
}

func TestRedlockBusyMajorityUndoesPartialAcquire(t *testing.T) {
	t.Parallel()
	_, clients := redlockNodes(t, 5)
	l := lock.NewRedlock(clients)
	ctx := context.Background()
	for _, c := range clients[:3] {
		if err := c.Set(ctx, l.Key("r"), "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.TryAcquire(ctx, "r", time.Minute); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("acquire with 3 of 5 nodes busy: %v, want ErrNotAcquired", err)
	}
	for i, c := range clients[3:] {
		if n := c.Exists(ctx, l.Key("r")).Val(); n != 0 {
			t.Fatalf("node %d kept the failed acquire's lock", 3+i)
		}
	}
	for i, c := range clients[:3] {
		if got := c.Get(ctx, l.Key("r")).Val(); got != "someone-else" {
			t.Fatalf("node %d: the other holder's key holds %q", i, got)
		}
	}
}

func TestRedlockReentrancy(t *testing.T) {
	t.Parallel()
	d := redlockDeployment(t, 5)
	l := d.locker()
	checkReentrancy(t, d, l, l, "r", time.Minute)
}

func TestNewRedlockRejectsEvenNodeCounts(t *testing.T) {
	t.Parallel()
	_, clients := redlockNodes(t, 4)
	for _, n := range []int{0, 2, 4} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "odd number of nodes") {
					t.Fatalf("NewRedlock with %d nodes: panic %v, want one about the odd count", n, r)
				}
			}()
			lock.NewRedlock(clients[:n])
		}()
	}
	if q := lock.NewRedlock(clients[:3]).Quorum(); q != 2 {
		t.Fatalf("quorum of 3 nodes = %d, want 2", q)
	}
}
