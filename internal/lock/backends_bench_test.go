package lock_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/benchhold"
	"github.com/lockstep-dev/lockstep/internal/etcdclient"
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
//   - limited: 16 goroutines cycle one key (Acquire with the default
//     backoff, hold 1 ms with benchhold.Hold, Release) as a lock and with
//     limit 4, b.N acquisitions each; x4 is limit 4's acquisitions/s over
//     the lock's, and spread the most acquisitions of one goroutine over the
//     fewest (waiters are served in arrival order on Redis and on etcd); on
//     etcd, proposals/op is the raft proposals its member committed per
//     acquisition (its release included).
//
//   - renew1000: one RenewAll of 1,000 held locks per op.
//
//     go test -run '^$' -bench 'Backends/(cycle|handoff|renew1000)/' -benchtime 2s ./internal/lock
//     go test -run '^$' -bench 'Backends/limited/' -benchtime 12s ./internal/lock (limited: about 40 permits per goroutine on etcd, so that the spread is not coarse)
func BenchmarkBackends(b *testing.B) {
	type backend struct {
		name   string
		locker func(b *testing.B) (*lock.Locker, func() float64)
	}
	backends := []backend{
		{"redis-single", func(b *testing.B) (*lock.Locker, func() float64) {
			return lock.New(redistest.Start(b).Client(func(o *redis.Options) { o.PoolSize = 128 })), nil
		}},
		{"etcd-1", func(b *testing.B) (*lock.Locker, func() float64) { return etcdLocker(b, 1) }},
		{"etcd-3", func(b *testing.B) (*lock.Locker, func() float64) { return etcdLocker(b, 3) }},
	}
	locker := func(b *testing.B, be backend) *lock.Locker {
		l, _ := be.locker(b)
		return l
	}
	for _, be := range backends {
		b.Run("cycle/"+be.name, func(b *testing.B) { benchCycle(b, locker(b, be)) })
	}
	for _, be := range backends {
		b.Run("handoff/"+be.name, func(b *testing.B) { benchHandoff(b, locker(b, be)) })
	}
	for _, be := range backends {
		b.Run("limited/"+be.name, func(b *testing.B) { benchLimited(b, be.locker) })
	}
	for _, be := range backends {
		b.Run("renew1000/"+be.name, func(b *testing.B) { benchRenew(b, locker(b, be), 1000) })
	}
}

func benchLimited(b *testing.B, newLocker func(*testing.B) (*lock.Locker, func() float64)) {
	const contenders, hold = 16, time.Millisecond
	l, proposals := newLocker(b)
	ctx := context.Background()
	rate := map[int]float64{}
	b.ResetTimer()
	for _, limit := range []int{1, 4} {
		key := fmt.Sprintf("limited-%d", limit)
		var left atomic.Int64
		left.Store(int64(b.N))
		var mu sync.Mutex
		var waits []time.Duration
		var counts []int
		var wg sync.WaitGroup
		var p0 float64
		if proposals != nil {
			p0 = proposals()
		}
		start := time.Now()
		for range contenders {
			wg.Go(func() {
				count := 0
				var mine []time.Duration
				for left.Add(-1) >= 0 {
					t0 := time.Now()
					lease, err := l.Acquire(ctx, key, 30*time.Second, lock.Permits(limit), lock.MaxWait(30*time.Second))
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
					count++
					benchhold.Hold(hold)
					if err := lease.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
				mu.Lock()
				waits, counts = append(waits, mine...), append(counts, count)
				mu.Unlock()
			})
		}
		wg.Wait()
		rate[limit] = float64(b.N) / time.Since(start).Seconds()
		if proposals != nil {
			b.ReportMetric((proposals()-p0)/float64(b.N), fmt.Sprintf("l%d-proposals/op", limit))
		}
		b.ReportMetric(rate[limit], fmt.Sprintf("l%d-acq/s", limit))
		if len(waits) > 0 {
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, fmt.Sprintf("l%d-wait-p99-ms", limit))
		}
		if len(counts) == contenders {
			b.ReportMetric(float64(slices.Max(counts))/float64(max(slices.Min(counts), 1)), fmt.Sprintf("l%d-spread", limit))
		}
	}
	b.ReportMetric(rate[4]/rate[1], "x4")
}

// etcdLocker starts an etcd cluster of members and returns a Locker on it,
// and the raft proposals its first member committed so far (from its
// metrics).
func etcdLocker(b *testing.B, members int) (*lock.Locker, func() float64) {
	cl := etcdtest.StartCluster(b, members).Client()
	l := etcdclient.NewLocker(cl)
	b.Cleanup(func() { _ = l.Close() })
	url := cl.Endpoints()[0] + "/metrics"
	return l, func() float64 {
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(string(body)) {
			if v, ok := strings.CutPrefix(line, "etcd_server_proposals_committed_total "); ok {
				n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
		}
		b.Fatalf("%s has no etcd_server_proposals_committed_total", url)
		return 0
	}
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
