package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// overGrants counts the windows between two admissions (server times,
// sorted) that hold more than N·w/Per + Burst of them (G11), and returns the
// worst one found.
func overGrants(at []time.Time, r lock.Rate) (n int, worst string) {
	burst := r.Burst
	if burst == 0 {
		burst = r.N
	}
	for i := range at {
		for j := i; j < len(at); j++ {
			w := at[j].Sub(at[i])
			// count ≤ N·w/Per + Burst, in integers: (count - Burst)·Per ≤ N·w
			if count := j - i + 1; int64(count-burst)*int64(r.Per) > int64(r.N)*int64(w) {
				n++
				worst = fmt.Sprintf("%d admissions within %v (bound %.2f)", count, w, float64(r.N)*float64(w)/float64(r.Per)+float64(burst))
			}
		}
	}
	return n, worst
}

// G11: over any window, admissions per key ≤ N·window/Per + Burst, with 32
// goroutines on two Lockers of their own clients (two processes' worth)
// asking at once and retrying after the wait Allow gives. It admits close
// to the rate too, so the bound is not met by admitting nothing.
func TestAllowNeverOverGrants(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	lockers := []*lock.Locker{
		lock.New(srv.Client(func(o *redis.Options) { o.PoolSize = 16 })),
		lock.New(srv.Client(func(o *redis.Options) { o.PoolSize = 16 })),
	}
	r := lock.Rate{N: 40, Per: time.Second, Burst: 5}
	const run = 2 * time.Second
	ctx := context.Background()
	var mu sync.Mutex
	var admitted []time.Time
	var denied int
	deadline := time.Now().Add(run)
	var wg sync.WaitGroup
	for g := range 32 {
		l := lockers[g%2]
		wg.Go(func() {
			for time.Now().Before(deadline) {
				wait, at, err := l.AllowAt(ctx, "rated", r)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if wait == 0 {
					admitted = append(admitted, at)
				} else {
					denied++
				}
				mu.Unlock()
				time.Sleep(wait) // 0 after an admission: ask again at once
			}
		})
	}
	wg.Wait()
	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	if n, worst := overGrants(admitted, r); n > 0 {
		t.Fatalf("%d windows over the bound, e.g. %s", n, worst)
	}
	span := admitted[len(admitted)-1].Sub(admitted[0])
	// every emission interval after the burst admits one: at least all but
	// a few of them (the goroutines' round trips are the slack)
	want := int(float64(r.N)*span.Seconds()) + r.Burst - 4
	if len(admitted) < want {
		t.Fatalf("%d admitted over %v, want at least %d: the limit under-grants", len(admitted), span, want)
	}
	t.Logf("%d admitted over %v (rate %d/%v, burst %d), %d denied, 0 windows over the bound",
		len(admitted), span.Round(time.Millisecond), r.N, r.Per, r.Burst, denied)
}

// Allow's wait is exactly the time until the next admission on the
// server's clock: an admission tried that much later succeeds, and a denied
// one counts nothing (many denials do not push the next admission back).
func TestAllowWaitIsTimeToNextAdmission(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	ctx := context.Background()
	r := lock.Rate{N: 10, Per: time.Second, Burst: 3} // one every 100ms, 3 at once
	var first time.Time
	for i := range r.Burst {
		wait, at, err := l.AllowAt(ctx, "wait", r)
		if err != nil || wait != 0 {
			t.Fatalf("admission %d of the burst: wait %v, err %v", i+1, wait, err)
		}
		if i == 0 {
			first = at
		}
	}
	// The burst spent: the next admission is one interval after the first.
	next := first.Add(100 * time.Millisecond)
	var wait time.Duration
	for range 20 {
		w, at, err := l.AllowAt(ctx, "wait", r)
		if err != nil {
			t.Fatal(err)
		}
		if !at.Before(next) {
			break // a slow machine: the turn came meanwhile
		}
		if want := next.Sub(at); w != want {
			t.Fatalf("wait %v at %v, want %v (the time until %v)", w, at.Format("15:04:05.000000"), want, next.Format("15:04:05.000000"))
		}
		wait = w
	}
	time.Sleep(wait)
	if w, _, err := l.AllowAt(ctx, "wait", r); err != nil || w != 0 {
		t.Fatalf("after waiting the wait: wait %v, err %v; want admitted", w, err)
	}
}

// A rate key lives while its state matters: it expires when its theoretical
// arrival time passes, after which it would say what no key says.
func TestRateKeyExpiresOnceIdle(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	r := lock.Rate{N: 2, Per: 400 * time.Millisecond} // 200ms apart, burst 2
	if _, err := l.Allow(ctx, "idle", r); err != nil {
		t.Fatal(err)
	}
	key := l.RateKey("idle")
	if !strings.HasPrefix(key, l.Key("idle")) {
		t.Fatalf("rate key %q is not under the resource's hash tag %q", key, l.Key("idle"))
	}
	pttl, err := c.PTTL(ctx, key).Result()
	if err != nil || pttl <= 0 || pttl > 200*time.Millisecond {
		t.Fatalf("rate key %s: pttl %v, err %v; want an expiry within one interval (200ms)", key, pttl, err)
	}
	eventually(t, 2*time.Second, "the idle rate key expired", func() bool { return c.Exists(ctx, key).Val() == 0 })
}

// Rate limits are the single back end's: on Redlock Allow says so.
func TestAllowRefusedOnRedlock(t *testing.T) {
	t.Parallel()
	nodes := redistest.StartN(t, 3)
	clients := make([]redis.UniversalClient, len(nodes))
	for i, n := range nodes {
		clients[i] = n.Client()
	}
	_, err := lock.NewRedlock(clients).Allow(context.Background(), "k", lock.Rate{N: 1, Per: time.Second})
	if err == nil || !strings.Contains(err.Error(), "single Redis back end") || !strings.Contains(err.Error(), "redlock") {
		t.Fatalf("Allow on Redlock: %v; want an error naming the single back end and redlock", err)
	}
}

func TestAllowRefusesBadRates(t *testing.T) {
	t.Parallel()
	l, _, _ := newLocker(t)
	for _, r := range []lock.Rate{{N: 0, Per: time.Second}, {N: 1}, {N: 1, Per: time.Second, Burst: -1}} {
		if _, err := l.Allow(context.Background(), "k", r); err == nil {
			t.Errorf("Allow(%+v): no error", r)
		}
	}
}

// On a Cluster the rate key lives in its key's slot, with the key's lock,
// and the limit holds per key on every master.
func TestClusterAllow(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	l := lock.New(cl.Client())
	ctx := context.Background()
	r := lock.Rate{N: 1, Per: time.Minute}
	for i := range 6 {
		key := fmt.Sprintf("tenant:%d", i)
		if w, err := l.Allow(ctx, key, r); err != nil || w != 0 {
			t.Fatalf("%s: first Allow: wait %v, err %v", key, w, err)
		}
		if w, err := l.Allow(ctx, key, r); err != nil || w <= 50*time.Second {
			t.Fatalf("%s: second Allow: wait %v, err %v; want about a minute", key, w, err)
		}
		if node, rate := cl.NodeFor(l.Key(key)), cl.NodeFor(l.RateKey(key)); node.Addr != rate.Addr {
			t.Fatalf("%s: rate key on %s, its lock's slot on %s", key, rate.Addr, node.Addr)
		}
	}
}

// Through Sentinel the limit lives on the master: two clients share it.
func TestSentinelAllow(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	a, b := lock.New(s.Client()), lock.New(s.Client())
	ctx := context.Background()
	r := lock.Rate{N: 1, Per: time.Minute}
	if w, err := a.Allow(ctx, "k", r); err != nil || w != 0 {
		t.Fatalf("first Allow: wait %v, err %v", w, err)
	}
	if w, err := b.Allow(ctx, "k", r); err != nil || w <= 50*time.Second {
		t.Fatalf("the other client's Allow: wait %v, err %v; want about a minute", w, err)
	}
}

// Rates reads each live rate key's state from what the script keeps, on the
// server's clock: the burst left, and when a key with none left allows the
// next one, the moment Allow's own wait names.
func TestRatesShowBurstLeftAndNext(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	other := lock.New(c, lock.WithPrefix("other:"))
	ctx := context.Background()
	r := lock.Rate{N: 1, Per: time.Hour, Burst: 3} // an hour apart: no turn comes back during the test
	state := func() lock.RateState {
		t.Helper()
		rs, err := l.Rates(ctx)
		if err != nil || len(rs) != 1 {
			t.Fatalf("Rates: %+v, err %v; want the one key", rs, err)
		}
		return rs[0]
	}
	if rs, err := l.Rates(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("Rates before any Allow: %+v, err %v", rs, err)
	}
	if _, err := l.Allow(ctx, "tenant:7", r); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Allow(ctx, "tenant:8", r); err != nil { // another prefix: not listed
		t.Fatal(err)
	}
	if s := state(); s.Key != "tenant:7" || s.Interval != time.Hour || s.Burst != 3 || s.BurstLeft != 2 || !s.Next.Equal(s.Now) {
		t.Fatalf("after one of a burst of 3: %+v; want 2 left, allowed now", s)
	}
	for range 2 {
		if w, err := l.Allow(ctx, "tenant:7", r); err != nil || w != 0 {
			t.Fatalf("Allow within the burst: wait %v, err %v", w, err)
		}
	}
	wait, at, err := l.AllowAt(ctx, "tenant:7", r)
	if err != nil || wait <= 0 {
		t.Fatalf("Allow past the burst: wait %v, err %v", wait, err)
	}
	if s := state(); s.BurstLeft != 0 || !s.Next.Equal(at.Add(wait)) || !s.Next.After(s.Now) {
		t.Fatalf("burst used up: %+v; want 0 left, next at %v (Allow's wait from its decision)", s, at.Add(wait))
	}
}

// On a Cluster, Rates reads every master.
func TestClusterRates(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	l := lock.New(cl.Client())
	ctx := context.Background()
	r := lock.Rate{N: 2, Per: time.Hour}
	want := map[string]bool{}
	nodes := map[string]bool{}
	for i := range 12 {
		key := fmt.Sprintf("tenant:%d", i)
		if _, err := l.Allow(ctx, key, r); err != nil {
			t.Fatal(err)
		}
		want[key] = true
		nodes[cl.NodeFor(l.RateKey(key)).Addr] = true
	}
	rs, err := l.Rates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rs {
		if !want[s.Key] || s.BurstLeft != 1 || s.Burst != 2 {
			t.Errorf("unexpected state %+v", s)
		}
		delete(want, s.Key)
	}
	if len(want) > 0 || len(nodes) < 2 {
		t.Fatalf("keys not read: %v (keys on %d masters)", want, len(nodes))
	}
}

// Reserve takes a task's turn when it is over the rate: it returns the wait
// to its turn (counted at once, so the next task's turn is one interval
// later), admits the task on that turn without counting again, answers a
// task back early with the rest of its wait, and makes a task back later
// than late ask afresh. A task under the rate is admitted now, as by Allow.
func TestReserveTakesTheTasksTurn(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	r := lock.Rate{N: 1, Per: 200 * time.Millisecond, Burst: 1}
	const late = 50 * time.Millisecond
	w, first, err := l.Reserve(ctx, "k", r, "q:a", late)
	if err != nil || w != 0 {
		t.Fatalf("a: wait %v, err %v; want admitted now", w, err)
	}
	wb, turnB, err := l.Reserve(ctx, "k", r, "q:b", late)
	if err != nil || wb <= 0 || !turnB.Equal(first.Add(200*time.Millisecond)) {
		t.Fatalf("b: wait %v, turn %v, err %v; want its turn one interval after a's admission %v", wb, turnB, err, first)
	}
	_, turnC, err := l.Reserve(ctx, "k", r, "q:c", late)
	if err != nil || !turnC.Equal(turnB.Add(200*time.Millisecond)) {
		t.Fatalf("c: turn %v, err %v; want one interval after b's %v", turnC, err, turnB)
	}
	if w, again, err := l.Reserve(ctx, "k", r, "q:b", late); err != nil || w <= 0 || !again.Equal(turnB) {
		t.Fatalf("b back early: wait %v, turn %v, err %v; want the rest of its wait to %v", w, again, err, turnB)
	}
	time.Sleep(time.Until(turnB)) // the server's clock and this one's are the same machine's
	redistest.WaitFor(t, time.Second, "b's turn on the server's clock", func() bool {
		now, err := c.Time(ctx).Result()
		return err == nil && !now.Before(turnB)
	})
	w, at, err := l.Reserve(ctx, "k", r, "q:b", late)
	if err != nil || w != 0 || !at.Equal(turnB) {
		t.Fatalf("b on its turn: wait %v, at %v, err %v; want admitted at its turn %v", w, at, err, turnB)
	}
	if n := c.Exists(ctx, l.RateKey("k")+":task:q:b").Val(); n != 0 {
		t.Fatalf("b's turn key still there after its admission")
	}
	// c comes back well after its turn + late: its turn is gone, it asks
	// afresh and gets the next one after everything counted (after c's own).
	time.Sleep(time.Until(turnC.Add(late + 20*time.Millisecond)))
	w, at, err = l.Reserve(ctx, "k", r, "q:c", late)
	if err != nil || at.Before(turnC.Add(200*time.Millisecond)) {
		t.Fatalf("c back late: wait %v, at %v, err %v; want a fresh turn, from one interval after its old one %v", w, at, err, turnC)
	}
}

// WaitAllow: callers over the rate, of two Lockers (two processes' worth),
// each arriving after the one before it had taken its turn, are admitted
// in that order, one emission interval apart, each with one script call and
// none before its turn on the server's clock; over any window the
// admissions keep the bound (G11).
func TestWaitAllowAdmitsInArrivalOrder(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client()
	lockers := []*lock.Locker{lock.New(srv.Client()), lock.New(srv.Client())}
	r := lock.Rate{N: 20, Per: time.Second, Burst: 1} // one each 50ms
	ctx := context.Background()
	tat := func() string { return admin.Get(ctx, lockers[0].KeyPrefix()+"waited}:rate").Val() }
	calls0 := commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval")

	const n = 8
	type admitted struct {
		at, returned time.Time
		err          error
	}
	out := make([]admitted, n)
	var wg sync.WaitGroup
	for i := range n {
		before := tat()
		wg.Go(func() {
			at, err := lockers[i%2].WaitAllow(ctx, "waited", r)
			out[i] = admitted{at, time.Now(), err}
		})
		// The next caller comes once this one's call has taken its turn.
		redistest.WaitFor(t, 5*time.Second, fmt.Sprintf("caller %d's turn taken", i), func() bool { return tat() != before })
	}
	wg.Wait()
	for i, a := range out {
		if a.err != nil {
			t.Fatalf("caller %d: %v", i, a.err)
		}
		if a.returned.Before(a.at.Add(-time.Millisecond)) {
			t.Errorf("caller %d returned at %v, before its turn %v", i, a.returned.Format("15:04:05.000"), a.at.Format("15:04:05.000"))
		}
		if i > 0 {
			if gap := a.at.Sub(out[i-1].at); gap < 50*time.Millisecond {
				t.Errorf("caller %d admitted %v after caller %d, want one interval (50ms) at least, in arrival order", i, gap, i-1)
			}
			if a.returned.Before(out[i-1].returned) {
				t.Errorf("caller %d returned before caller %d, which came first", i, i-1)
			}
		}
	}
	if calls := commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval") - calls0; calls > n+2 { // +2: a script load's first EVAL per client
		t.Errorf("%d script calls for %d callers, want one each: a waiter polled", calls, n)
	}
	ats := make([]time.Time, n)
	for i, a := range out {
		ats[i] = a.at
	}
	if over, worst := overGrants(ats, r); over > 0 {
		t.Errorf("%d windows over the bound, the worst %s", over, worst)
	}

	// A caller that gives up before its turn leaves it counted: the next
	// one's turn comes after it.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := lockers[0].WaitAllow(short, "waited", r); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller whose context ended first: %v, want its deadline", err)
	}
	next, err := lockers[1].WaitAllow(ctx, "waited", r)
	if err != nil {
		t.Fatal(err)
	}
	if gap := next.Sub(out[n-1].at); gap < 2*50*time.Millisecond {
		t.Errorf("the turn after one given up came %v after the last admission, want two intervals: the given-up turn stays counted", gap)
	}
}

// commandCalls is how many times the server behind c has run command
// (INFO commandstats).
func commandCalls(t *testing.T, c *redis.Client, command string) int64 {
	t.Helper()
	stats, err := commandStats(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return stats[command]
}

// Concurrent admissions through one Locker share script calls (batch.go),
// and each gets its own key's answer, whatever its mode: 32 goroutines, a
// key each at a burst of 2 per hour, each asks Allow three times, WaitAllow
// once and Reserve once, over and over in rounds of fresh keys. Each key
// admits exactly its burst, every later ask is told the wait to its own
// key's next admission, and a reserve and a wait take the two turns after
// it; yet far fewer calls reach the server than admissions were asked.
func TestConcurrentAdmissionsShareCalls(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	r := lock.Rate{N: 1, Per: time.Hour, Burst: 2}
	const goroutines, rounds, asks = 32, 10, 5
	calls0 := scriptCalls(t, c)
	together(t, goroutines, func(g int) error {
		for round := range rounds {
			key := fmt.Sprintf("share:%d:%d", round, g)
			for i := range 3 {
				wait, err := l.Allow(ctx, key, r)
				switch {
				case err != nil:
					return err
				case i < 2 && wait != 0:
					return fmt.Errorf("%s: ask %d refused (wait %v) within its burst of 2", key, i+1, wait)
				case i == 2 && (wait <= 0 || wait > r.Per):
					return fmt.Errorf("%s: ask 3 over the burst: wait %v, want (0, %v]", key, wait, r.Per)
				}
			}
			// Over the rate, a reserve takes the next turn (one interval on)
			// and a wait the one after: its context ends long before.
			wait, _, err := l.Reserve(ctx, key, r, "task-"+key, time.Second)
			if err != nil {
				return err
			}
			if wait <= r.Per-time.Minute || wait > r.Per {
				return fmt.Errorf("%s: reserve's wait %v, want its key's next turn, about %v", key, wait, r.Per)
			}
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = l.WaitAllow(short, key, r)
			cancel()
			turns := 2 // the reserved turn and the waited-for one
			switch {
			case err != nil && strings.Contains(err.Error(), "was not waited for"):
			case errors.Is(err, context.DeadlineExceeded):
				turns = 1 // given up before its call was sent: nothing counted
			default:
				return fmt.Errorf("%s: a wait for the turn after the reserved one: %v, want its deadline", key, err)
			}
			wait, err = l.Allow(ctx, key, r)
			if err != nil {
				return err
			}
			// the next free turn: one interval after the last taken
			if want := time.Duration(turns+1) * r.Per; wait <= want-time.Minute || wait > want {
				return fmt.Errorf("%s: after %d turns taken, the next admission in %v, want about %v", key, turns, wait, want)
			}
		}
		return nil
	})
	asked := int64(goroutines * rounds * (asks + 1))
	calls := scriptCalls(t, c) - calls0
	if calls*4 >= asked*3 {
		t.Fatalf("%d script calls for %d admissions asked: few were shared", calls, asked)
	}
	t.Logf("%d script calls for %d admissions asked", calls, asked)
}
