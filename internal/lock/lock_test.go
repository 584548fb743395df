package lock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestTryAcquireBusy(t *testing.T) {
	t.Parallel()
	l, c, a := newHeld(t, "r", time.Minute)
	ctx := context.Background()
	if _, err := l.TryAcquire(ctx, "r", time.Minute); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: %v, want ErrNotAcquired", err)
	}
	if got := c.Get(ctx, "lockstep:{r}").Val(); got != a.Token() || len(strings.Split(got, "|")[0]) != 32 {
		t.Fatalf("lock key holds %q, want the token %q, 128 random bits first", got, a.Token())
	}
	if ttl := c.PTTL(ctx, "lockstep:{r}").Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("lock PTTL %v, want within (0, 1m]", ttl)
	}
	// The counter outlives the lock by the fence TTL.
	if ttl := c.PTTL(ctx, "lockstep:{r}:fence").Val(); ttl <= time.Minute || ttl > time.Minute+lock.DefaultFenceTTL {
		t.Fatalf("fence counter PTTL %v, want within (1m, 1m + %v]", ttl, lock.DefaultFenceTTL)
	}
}

func TestTokenCarriesHolder(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := lock.WithJob(context.Background(), "task|1 x", "demo:order.pay")
	before := time.Now().Truncate(time.Millisecond)
	a := mustAcquire(t, ctx, l, "r", time.Minute)
	stored := c.Get(ctx, "lockstep:{r}").Val()
	info := lock.ParseToken(stored)
	host, _ := os.Hostname()
	want := host + ":" + strconv.Itoa(os.Getpid())
	if info.Holder != want || info.TaskID != "task|1 x" || info.Type != "demo:order.pay" {
		t.Fatalf("ParseToken(%q) = %+v, want holder %q, task %q, type demo:order.pay", stored, info, want, "task|1 x")
	}
	if info.Acquired.Before(before) || info.Acquired.After(time.Now()) {
		t.Fatalf("acquired %v, want between %v and now", info.Acquired, before)
	}
	// The suffix is part of the token: renew and release compare it whole.
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, "lockstep:{r}").Val(); n != 0 {
		t.Fatal("lock key still there after release")
	}

	if got := lock.ParseToken("0123abcd"); got != (lock.TokenInfo{}) {
		t.Fatalf("ParseToken of a bare token = %+v, want zero", got)
	}
	plain := mustAcquire(t, context.Background(), l, "p", time.Minute)
	if got := lock.ParseToken(plain.Token()); got.Holder != want || got.TaskID != "" || got.Type != "" {
		t.Fatalf("plain acquire: %+v, want holder only", got)
	}
}

func TestReleaseAfterExpiryLeavesNextHolder(t *testing.T) {
	t.Parallel()
	l, c, first := newHeld(t, "r", 50*time.Millisecond)
	ctx := context.Background()
	eventually(t, 2*time.Second, "the first lease to expire", func() bool {
		return c.Exists(ctx, first.RedisKey()).Val() == 0
	})
	second, err := l.TryAcquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatalf("acquire after expiry: %v", err)
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence after expiry %d <= %d", second.Fence(), first.Fence())
	}

	start := time.Now()
	err = first.Release(ctx)
	if !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Release: %v, want ErrLockLost", err)
	}
	if got := c.Get(ctx, second.RedisKey()).Val(); got != second.Token() {
		t.Fatalf("late Release touched the next holder's lock: key holds %q", got)
	}
	// Once lost, the lease answers without Redis.
	if err := first.Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Renew after loss: %v", err)
	}
	if err := first.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("second Release after loss: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("calls after loss took %v", d)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatalf("repeated Release: %v, want nil", err)
	}
}

func TestRenewExtendsTTL(t *testing.T) {
	t.Parallel()
	_, c, lease := newHeld(t, "r", time.Second)
	ctx := context.Background()
	if err := c.PExpire(ctx, lease.RedisKey(), 100*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, lease.RedisKey()).Val(); ttl <= 500*time.Millisecond {
		t.Fatalf("PTTL after Renew %v, want close to 1s", ttl)
	}
	if err := c.Del(ctx, lease.RedisKey()).Err(); err != nil {
		t.Fatal(err)
	}
	err := lease.Renew(ctx)
	var lost *lock.LostError
	if !errors.As(err, &lost) || lost.Reason != lock.ReasonExpired || lost.Key != "r" {
		t.Fatalf("Renew of a deleted key: %v, want ErrLockLost (expired) on r", err)
	}
}

func TestReentrancy(t *testing.T) {
	t.Parallel()
	d := singleServer(t)
	l, c := d.locker(), d.admin[0]
	ctx := context.Background()
	outer, next := checkReentrancy(t, d, l, l, "r", time.Minute)
	mine := lock.WithOwner(ctx, "owner-a")

	// A hash left over from an earlier hold (it can outlive its lock by a
	// moment) must not let its owner into a plain holder's lock.
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	plain := mustAcquire(t, ctx, l, "r", time.Minute)
	if err := c.HSet(ctx, "lockstep:{r}:owners", "t", outer.Token(), "o:owner-a", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(mine, "r", time.Minute); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("stale hash let its owner into a plain hold: %v", err)
	}
	_ = plain
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("with a replica", func(t *testing.T) {
		t.Parallel()
		master, replica := redistest.StartWithReplica(t)
		l := lock.New(master.Client(), lock.WaitReplicas(1, 2*time.Second))
		lease, err := l.TryAcquire(ctx, "r", time.Minute)
		if err != nil {
			t.Fatalf("acquire with one replica attached: %v", err)
		}
		if got := replica.Client().Get(ctx, lease.RedisKey()).Val(); got != lease.Token() {
			t.Fatalf("replica holds %q, want the token", got)
		}
	})
	t.Run("without one", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		c := srv.Client()
		l := lock.New(c, lock.WaitReplicas(1, 100*time.Millisecond))
		_, err := l.TryAcquire(ctx, "r", time.Minute)
		if !errors.Is(err, lock.ErrReplicas) {
			t.Fatalf("acquire with no replica: %v, want ErrReplicas", err)
		}
		if n := c.Exists(ctx, l.Key("r")).Val(); n != 0 {
			t.Fatal("failed acquire left its lock behind")
		}
		if _, err := lock.New(c).TryAcquire(ctx, "r", time.Minute); err != nil {
			t.Fatalf("the resource stayed blocked: %v", err)
		}
	})
}

func TestRedisKilledReturnsErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(func(o *redis.Options) { o.MaxRetries = 1; o.DialTimeout = 200 * time.Millisecond })
	l := lock.New(c)
	ctx := context.Background()
	lease := mustAcquire(t, ctx, l, "r", time.Minute)
	srv.Kill()
	if _, err := l.TryAcquire(ctx, "other", time.Minute); err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with Redis dead: %v, want a transport error", err)
	} else if !containsAll(err.Error(), "acquire", "other") {
		t.Fatalf("error %q does not name the operation and key", err)
	}
	if err := lease.Renew(ctx); err == nil || errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Renew with Redis dead: %v, want a transport error (not a loss)", err)
	}
	if err := lease.Release(ctx); err == nil {
		t.Fatal("Release with Redis dead returned nil")
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(wctx, "r", time.Minute); err == nil {
		t.Fatal("Acquire with Redis dead returned nil")
	}
}

func TestOptionsThatDoNotApplyAreRejected(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	mustPanic := func(what, want string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, want) {
				t.Fatalf("%s: panic %v, want one naming %q", what, r, want)
			}
		}()
		f()
	}
	mustPanic("New with WithNodeTimeout", "WithNodeTimeout does not apply to the single back end", func() {
		lock.New(c, lock.WithNodeTimeout(time.Second))
	})
	mustPanic("New with WithClockDrift", "WithClockDrift", func() { lock.New(c, lock.WithClockDrift(time.Millisecond)) })
	nodes := []redis.UniversalClient{c, c, c}
	mustPanic("NewRedlock with WaitReplicas", "WaitReplicas does not apply to the redlock back end", func() {
		lock.NewRedlock(nodes, lock.WaitReplicas(1, time.Second))
	})
	if l := lock.New(c, lock.WithPrefix("p:"), lock.WaitReplicas(1, time.Second)); l.Backend() != "single" || !l.SharesClient() {
		t.Fatalf("Backend() = %q, SharesClient() = %v, want single, true", l.Backend(), l.SharesClient())
	}
	if l := lock.NewRedlock(nodes, lock.WithNodeTimeout(time.Second)); l.Backend() != "redlock" || l.SharesClient() {
		t.Fatalf("Backend() = %q, SharesClient() = %v, want redlock, false", l.Backend(), l.SharesClient())
	}
}

// A forced end hands on: Break of a lock with an Acquire waiting gives the
// waiter the lock in the same step (before Break returns; the waiter's own
// retry is 5 s away), with a fence above the broken holder's, and the broken
// holder's next renewal finds another holder's token (stolen).
func TestBreakHandsTheLockToTheFirstWaiter(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	for i := range 3 {
		res := fmt.Sprint("forced:", i)
		holder := mustAcquire(t, ctx, l, res, time.Minute)
		got := make(chan *lock.Lease, 1)
		go func() {
			lease, err := l.Acquire(ctx, res, 10*time.Second, slowFallback, lock.MaxWait(20*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		eventually(t, 5*time.Second, "the waiter in the queue", func() bool { return queued(c, l, res) == 1 })
		h, err := l.Held(ctx, res)
		if err != nil || h == nil || h.Token != holder.Token() {
			t.Fatalf("held %s: %+v, %v", res, h, err)
		}
		before := time.Now()
		broken, err := l.Break(ctx, *h)
		after := time.Now()
		if err != nil || !broken {
			t.Fatalf("break %d: broken %v, err %v", i, broken, err)
		}
		var lease *lock.Lease
		select {
		case lease = <-got:
		case <-time.After(4 * time.Second):
			t.Fatalf("break %d: the waiter was not handed the lock (its own retry is 5 s away)", i)
		}
		if lease == nil {
			t.FailNow()
		}
		t.Logf("break %d: the waiter holds from %v after the break was sent, its Acquire returned after %v",
			i, lease.AcquiredAt().Sub(before), time.Since(before))
		if lease.AcquiredAt().After(after) {
			t.Errorf("break %d: the waiter's hold began %v after Break returned, want in the same step", i, lease.AcquiredAt().Sub(after))
		}
		if lease.Fence() <= h.Fence {
			t.Errorf("break %d: the waiter's fence %d is not above the broken holder's %d", i, lease.Fence(), h.Fence)
		}
		if v := c.Get(ctx, l.Key(res)).Val(); v != lease.Token() {
			t.Errorf("break %d: the key holds %q, want the waiter's token", i, v)
		}
		var lost *lock.LostError
		if err := holder.Renew(ctx); !errors.As(err, &lost) || lost.Reason != lock.ReasonStolen {
			t.Errorf("break %d: the broken holder's renewal: %v, want lost (stolen)", i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Break of a held lock whose holder renews it at that very moment (a
// renewal between Break's WATCH and EXEC touches the key) still deletes it:
// the holder's lock did not change hands.
func TestBreakDeletesALockBeingRenewed(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	for i := range 20 {
		res := fmt.Sprint("renewed:", i)
		lease := mustAcquire(t, ctx, l, res, time.Minute)
		stop := make(chan struct{})
		renewed := make(chan struct{})
		go func() { // the holder renewing as fast as it can
			defer close(renewed)
			for {
				select {
				case <-stop:
					return
				default:
					_ = lease.Renew(ctx)
				}
			}
		}()
		h, err := l.Held(ctx, res)
		if err != nil || h == nil {
			t.Fatalf("held %s: %v, %v", res, h, err)
		}
		broken, err := l.Break(ctx, *h)
		close(stop)
		<-renewed
		if err != nil || !broken {
			t.Fatalf("break %d of a lock being renewed: broken %v, err %v", i, broken, err)
		}
		if n := c.Exists(ctx, l.Key(res)).Val(); n != 0 {
			t.Fatalf("break %d: the key is still there", i)
		}
	}
}
