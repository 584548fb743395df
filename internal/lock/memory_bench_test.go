package lock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// BenchmarkMemoryReleasedResources locks b.N distinct resources once each
// (64 goroutines, a 200 ms TTL, the default lock.fence_ttl) and releases
// them, then reports what Redis keeps: bytes and keys per resource at once
// (no key of a resource: only the fence floors of the Cluster slots used,
// at most 16,384 whatever the number of resources) and once their bound,
// the lock's TTL + lock.fence_ttl after the last release, has passed
// (nothing). Baseline in the same run: a plain SET NX PX + DEL of the same
// keys, which leaves nothing by construction.
//
//	go test -run '^$' -bench MemoryReleased -benchtime 1000000x ./internal/lock
func BenchmarkMemoryReleasedResources(b *testing.B) {
	const ttl = 200 * time.Millisecond
	fenceTTL := lock.DefaultFenceTTL
	c := benchClient(b)
	ctx := context.Background()
	l := lock.New(c, lock.WithFenceTTL(fenceTTL))
	cycle := func(fn func(key string) error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchGoroutines {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
					if err := fn("order:" + strconv.FormatInt(i, 10)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	mem := func() (used, keys int64) {
		info := c.Info(ctx, "memory").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				used, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return used, c.DBSize(ctx).Val()
	}
	c.ConfigSet(ctx, "activedefrag", "no")
	used0, keys0 := mem()
	b.ResetTimer()
	cycle(func(key string) error {
		lease, err := l.TryAcquire(ctx, key, ttl)
		if err != nil {
			return err
		}
		return lease.Release(ctx)
	})
	b.StopTimer()
	used1, keys1 := mem()
	n := float64(b.N)
	b.ReportMetric(float64(used1-used0)/n, "bytes/resource-released")
	b.ReportMetric(float64(keys1-keys0)/n, "keys/resource-released")
	b.ReportMetric(float64(keys1-keys0), "keys-left")
	// Once the bound has passed: Redis expires keys lazily and in its
	// active cycle; wait for the count to reach the start, bounded.
	bound := ttl + fenceTTL
	deadline := time.Now().Add(bound + 60*time.Second)
	time.Sleep(bound)
	for c.DBSize(ctx).Val() > keys0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	used2, keys2 := mem()
	b.ReportMetric(float64(max(used2-used0, 0))/n, "bytes/resource-after-bound")
	b.ReportMetric(float64(keys2-keys0), "keys-left-after-bound")

	// The baseline: SET NX PX + DEL on other keys, same run, same server.
	usedB0, _ := mem()
	cycle(func(key string) error {
		key = "raw:" + key
		if ok, err := c.SetNX(ctx, key, "t", ttl).Result(); err != nil || !ok {
			return fmt.Errorf("SET NX %s: %v %v", key, ok, err)
		}
		return c.Del(ctx, key).Err()
	})
	usedB1, _ := mem()
	b.ReportMetric(float64(max(usedB1-usedB0, 0))/n, "baseline-bytes/resource")
	_ = redis.Nil
}
