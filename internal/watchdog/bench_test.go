package watchdog_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// BenchmarkLossNotice measures, with 1,000 leases held, how soon a holder
// sees its key deleted (one deletion at a time, the others held throughout),
// and what holding costs Redis in commands per second beyond an idle
// process: with server notices (client tracking) and, as the baseline, with
// renewals alone. The TTL is 3s (renewal every 1s) so that the baseline's
// latency, up to one renewal interval, stays measurable.
//
//	go test -run '^$' -bench LossNotice -benchtime 1x ./internal/watchdog
func BenchmarkLossNotice(b *testing.B) {
	const held, deletions, ttl = 1000, 20, 3 * time.Second
	for _, mode := range []string{"notices", "renewal-only"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				srv := redistest.Start(b)
				c := srv.Client()
				admin := srv.Client()
				l := lock.New(c)
				m := metrics.New(nil)
				opts := watchdog.Options{Metrics: m}
				if mode == "notices" {
					opts.Notifier = watchdog.Tracking(c, l.KeyPrefix(), nil)
				}
				wd := watchdog.New(opts)
				idle := commandsPerSecond(b, admin, time.Second)
				ctxs := make([]context.Context, held)
				holds := make([]*watchdog.Hold, held)
				for i := range held {
					lease, err := l.TryAcquire(context.Background(), fmt.Sprint("bench:", i), ttl)
					if err != nil {
						b.Fatal(err)
					}
					ctxs[i], holds[i] = wd.Hold(context.Background(), lease)
				}
				if mode == "notices" {
					// Past the first (re)subscribe's check of every lease: a
					// deletion that lands with one of its renewals would be
					// taken for the renewal's own notice (see waitChecked).
					redistest.WaitFor(b, 10*time.Second, "the (re)subscribe's check of every lease", func() bool {
						return testutil.ToFloat64(m.LockNotices) >= 1 &&
							testutil.ToFloat64(m.Renewals.WithLabelValues("renewed")) >= held
					})
				}
				busy := commandsPerSecond(b, admin, 3*time.Second)
				var lat []time.Duration
				for i := range deletions {
					k := i * (held / deletions)
					deleted := time.Now()
					if err := admin.Del(context.Background(), l.Key(fmt.Sprint("bench:", k))).Err(); err != nil {
						b.Fatal(err)
					}
					select {
					case <-ctxs[k].Done():
						lat = append(lat, time.Since(deleted))
					case <-time.After(2 * ttl):
						b.Fatalf("lease %d not cancelled within %v", k, 2*ttl)
					}
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric(busy-idle, "extra-cmds/s")
				for _, h := range holds {
					h.Stop()
				}
				_ = wd.Stop(context.Background())
				c.Close()
				admin.Close()
			}
		})
	}
}

// commandsPerSecond is the server's command rate over d (INFO stats), less
// the one INFO of the measurement itself.
func commandsPerSecond(b *testing.B, c *redis.Client, d time.Duration) float64 {
	b.Helper()
	read := func() float64 {
		info, err := c.Info(context.Background(), "stats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				n, _ := strconv.ParseFloat(v, 64)
				return n
			}
		}
		b.Fatal("no total_commands_processed in INFO")
		return 0
	}
	before := read()
	time.Sleep(d)
	return (read() - before - 1) / d.Seconds()
}
