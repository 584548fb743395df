package lockstep_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// BenchmarkOneCaller is one goroutine's uncontended cycle, each way on the
// same redis-server in one run: raw SET NX PX + DEL (the floor), the lock
// layer's TryAcquire + Release, and WithLock (watchdog and loss notices on,
// tracing off). Besides ns/op it reports the client's and Redis's CPU and
// the server commands per cycle; -benchmem gives the allocations.
//
//	go test -run '^$' -bench OneCaller -benchmem -count 5 .
func BenchmarkOneCaller(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	const ttl = 30 * time.Second
	measure := func(b *testing.B, cycle func() error) {
		b.Helper()
		if err := cycle(); err != nil { // warm: scripts loaded, connections open
			b.Fatal(err)
		}
		cmds0, cpu0, self0 := redistest.Commands(b, c), redistest.CPU(b, c), proctest.SelfCPU(b)
		b.ResetTimer()
		for range b.N {
			if err := cycle(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		ops := float64(b.N)
		b.ReportMetric(float64(redistest.Commands(b, c)-cmds0-1)/ops, "server-cmds/op") // -1: the INFO CPU between
		b.ReportMetric(float64((redistest.CPU(b, c)-cpu0).Microseconds())/ops, "redis-cpu-us/op")
		b.ReportMetric(float64((proctest.SelfCPU(b)-self0).Microseconds())/ops, "client-cpu-us/op")
	}
	b.Run("raw", func(b *testing.B) {
		measure(b, func() error {
			if ok, err := c.SetNX(ctx, "raw", "token", ttl).Result(); err != nil || !ok {
				return err
			}
			return c.Del(ctx, "raw").Err()
		})
	})
	b.Run("TryAcquire", func(b *testing.B) {
		l := lock.New(c)
		measure(b, func() error {
			lease, err := l.TryAcquire(ctx, "try", ttl)
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		})
	})
	b.Run("WithLock", func(b *testing.B) {
		l := lockstep.NewLocker(c)
		defer func() { _ = l.Close(ctx) }()
		work := func(context.Context, *lockstep.Lease) error { return nil }
		measure(b, func() error { return l.WithLock(ctx, "with", work, lockstep.TTL(ttl)) })
	})
}
