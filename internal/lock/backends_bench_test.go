package lock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// BenchmarkBackends puts the back ends side by side in one run: Redis single
// (one server), etcd with one member and etcd with three (every write a raft
// commit on a quorum; data in /dev/shm, so fsync costs little here and more on
// real disks).
//
//   - cycle: one TryAcquire + Release per op, 64 goroutines on their own keys.
//
//   - handoff: 8 goroutines contend for one key with Acquire (backoff 1–10ms)
//     and release it at once; an op is one acquire of the hot key (the worker
//     that released may take it again: this is contended throughput).
//
//   - renew1000: one RenewAll of 1,000 held locks per op.
//
//     go test -run '^$' -bench Backends -benchtime 2s ./internal/lock
func BenchmarkBackends(b *testing.B) {
	type backend struct {
		name   string
		locker func(b *testing.B) *lock.Locker
	}
	backends := []backend{
		{"redis-single", func(b *testing.B) *lock.Locker {
			return lock.New(redistest.Start(b).Client(func(o *redis.Options) { o.PoolSize = 128 }))
		}},
		{"etcd-1", func(b *testing.B) *lock.Locker { return etcdLocker(b, 1) }},
		{"etcd-3", func(b *testing.B) *lock.Locker { return etcdLocker(b, 3) }},
	}
	for _, be := range backends {
		b.Run("cycle/"+be.name, func(b *testing.B) { benchCycle(b, be.locker(b)) })
	}
	for _, be := range backends {
		b.Run("handoff/"+be.name, func(b *testing.B) { benchHandoff(b, be.locker(b)) })
	}
	for _, be := range backends {
		b.Run("renew1000/"+be.name, func(b *testing.B) { benchRenew(b, be.locker(b), 1000) })
	}
}

func etcdLocker(b *testing.B, members int) *lock.Locker {
	l := lock.NewEtcd(etcdtest.StartCluster(b, members).Client())
	b.Cleanup(func() { _ = l.Close() })
	return l
}

func benchCycle(b *testing.B, l *lock.Locker) {
	ctx := context.Background()
	b.SetParallelism((benchGoroutines + 1) / max(1, runtimeProcs()))
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("cycle-%d", n.Add(1))
		for pb.Next() {
			lease, err := l.TryAcquire(ctx, key, 30*time.Second)
			if !released(b, lease, err) {
				return
			}
		}
	})
}

func benchHandoff(b *testing.B, l *lock.Locker) {
	const workers = 8
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	backoff := lock.WithWaitBackoff(backoff.Jitter{Min: time.Millisecond, Max: 10 * time.Millisecond})
	var wg sync.WaitGroup
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, "hot", 30*time.Second, backoff, lock.MaxWait(30*time.Second))
				if !released(b, lease, err) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// released releases the lease an acquire returned, and reports whether the
// acquire and the release both succeeded (an error fails b).
func released(b *testing.B, lease *lock.Lease, err error) bool {
	if err == nil {
		err = lease.Release(context.Background())
	}
	if err != nil {
		b.Error(err)
		return false
	}
	return true
}

// acquireN takes n locks, prefix0 to prefix(n-1), each for a minute.
func acquireN(b *testing.B, l *lock.Locker, prefix string, n int) []*lock.Lease {
	leases := make([]*lock.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.TryAcquire(context.Background(), fmt.Sprintf("%s%d", prefix, i), time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	return leases
}

func benchRenew(b *testing.B, l *lock.Locker, n int) {
	ctx := context.Background()
	leases := acquireN(b, l, "renew-", n)
	renew := func() {
		for i, err := range l.RenewAll(ctx, leases) {
			if err != nil {
				b.Fatalf("lease %d: %v", i, err)
			}
		}
	}
	renew() // warm up: scripts loaded, connections open
	b.ResetTimer()
	for range b.N {
		renew()
	}
}
