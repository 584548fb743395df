package lock_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// The fence is max(counter + 1, server TIME in µs): the tests below break
// each half on purpose and check that fences still strictly increase.

// TestFenceAcrossRestartWithoutData restarts Redis empty (no persistence:
// the counter is gone, as after a failover to a replica that never had it):
// the next fence still exceeds the last one, from the server's clock.
func TestFenceAcrossRestartWithoutData(t *testing.T) {
	t.Parallel()
	l, c, srv := newLocker(t)
	checkFenceRisesAfter(t, l, "restart", 5, "a restart", func() {
		restartAndWait(t, srv, c)
		if n := c.Exists(context.Background(), l.FenceKey("restart")).Val(); n != 0 {
			t.Fatalf("the counter survived a restart without persistence")
		}
	})
}

// TestFenceAcrossAOFRestart: with persistence the counter survives, and
// fences go on from it.
func TestFenceAcrossAOFRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.StartAOF(t)
	c := srv.Client()
	l := lock.New(c)
	checkFenceRisesAfter(t, l, "aof", 5, "an AOF restart", func() { restartAndWait(t, srv, c) })
}

// TestFenceWhenAFailoverLostIncrements rolls the counter back, as a replica
// promoted before it saw the last increments would have it: the server clock
// has moved on since, so the next fence is still above every one handed out.
func TestFenceWhenAFailoverLostIncrements(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	first := cycleFences(t, l, "rollback", 1)
	checkFenceRisesAfter(t, l, "rollback", 20, "the counter lost its last increments", func() {
		if err := c.Set(context.Background(), l.FenceKey("rollback"), first, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// checkFenceRisesAfter cycles resource n times, runs fault, and checks that
// the next fence exceeds every one before; after names fault in the failure.
func checkFenceRisesAfter(t *testing.T, l *lock.Locker, resource string, n int, after string, fault func()) {
	t.Helper()
	last := cycleFences(t, l, resource, n)
	fault()
	if f := cycleFences(t, l, resource, 1); f <= last {
		t.Fatalf("fence after %s %d <= %d", after, f, last)
	}
}

// restartAndWait restarts srv and waits until c reaches it again.
func restartAndWait(t *testing.T, srv *redistest.Server, c *redis.Client) {
	t.Helper()
	srv.Restart()
	redistest.WaitFor(t, 5*time.Second, "the restarted server", func() bool { return c.Ping(context.Background()).Err() == nil })
}

// TestFenceWhenTheClockIsBehindTheCounter puts the counter far ahead of the
// server's clock (a clock stepped back, or many acquires in one µs): fences
// go on from counter + 1.
func TestFenceWhenTheClockIsBehindTheCounter(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	ahead := time.Now().Add(24 * time.Hour).UnixMicro()
	if err := c.Set(ctx, l.FenceKey("ahead"), ahead, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i <= 3; i++ {
		if f := cycleFences(t, l, "ahead", 1); f != ahead+i {
			t.Fatalf("acquire %d: fence %d, want counter+1 = %d", i, f, ahead+i)
		}
	}
	if v, _ := c.Get(ctx, l.FenceFloorKey("ahead")).Int64(); v != ahead+3 {
		t.Fatalf("fence floor %d, want %d: the fence released is kept", v, ahead+3)
	}
}

// TestFenceKeysHaveBoundedLifetime: a cycle leaves no key of its resource;
// the one key left, its slot's fence floor, expires the lock's ttl + the
// fence TTL after the last release; nothing of a finished wait stays.
func TestFenceKeysHaveBoundedLifetime(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t, lock.WithFenceTTL(time.Hour))
	ctx := context.Background()
	cycleFences(t, l, "bounded", 3)
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != l.FenceFloorKey("bounded") {
		t.Fatalf("keys after 3 cycles: %v, want only the slot's fence floor", keys)
	}
	if ttl := c.PTTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > time.Hour+time.Minute { // cycleFences: 1m leases
		t.Fatalf("fence floor TTL %v, want (0, 1h1m]", ttl)
	}
}

// TestConcurrentCyclesShareCallsAndKeepFences runs many goroutines on few
// keys through one Locker (their acquires and releases share script calls)
// and checks per key that holds never overlap and fences strictly increase.
func TestConcurrentCyclesShareCallsAndKeepFences(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	const goroutines, keys, cycles = 32, 4, 100
	var mu sync.Mutex
	holding := map[string]bool{}
	fences := map[string][]int64{}
	calls0 := scriptCalls(t, c)
	together(t, goroutines, func(g int) error {
		key := "k" + strconv.Itoa(g%keys)
		for n := 0; n < cycles; {
			lease, err := l.TryAcquire(ctx, key, time.Minute)
			if err != nil {
				continue // busy: another goroutine has this key
			}
			n++
			mu.Lock()
			twice := holding[key]
			holding[key] = true
			fences[key] = append(fences[key], lease.Fence())
			mu.Unlock()
			if twice {
				_ = lease.Release(ctx)
				return fmt.Errorf("%s held twice", key)
			}
			mu.Lock()
			holding[key] = false
			mu.Unlock()
			if err := lease.Release(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	for key, fs := range fences {
		checkIncreasing(t, key+": ", fs)
	}
	if calls := scriptCalls(t, c) - calls0; calls >= 2*goroutines*cycles {
		t.Fatalf("script calls %d for %d cycles: no call was shared", calls, goroutines*cycles)
	}
}

// cycleFences acquires and releases resource n times and returns the last
// fence, checking that each exceeds the one before.
func cycleFences(t *testing.T, l *lock.Locker, resource string, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var last int64
	for i := range n {
		lease, err := l.TryAcquire(ctx, resource, time.Minute)
		if err != nil {
			t.Fatalf("acquire %d of %s: %v", i, resource, err)
		}
		if lease.Fence() <= last {
			t.Fatalf("acquire %d of %s: fence %d <= %d", i, resource, lease.Fence(), last)
		}
		last = lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// scriptCalls is the server's count of EVALSHA and EVAL calls.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	stats, err := commandStats(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return stats["evalsha"] + stats["eval"]
}
