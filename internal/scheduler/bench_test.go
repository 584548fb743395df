package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// BenchmarkTickLateness reports how late ticks are enqueued (enqueue time −
// scheduled time) as p50 and p99, for 100 schedules firing every second
// against one Redis:
//
//   - lockstep: 3 replicas, each tick claimed in Redis and enqueued once;
//   - asynq_no_claim: the baseline, one process enqueuing each tick with
//     asynq at its time and no coordination (what one replica of asynq's own
//     scheduler does; three of them would enqueue every tick three times).
//
// One iteration is one second of ticks: use -benchtime Nx for N seconds.
//
//	go test -run '^$' -bench TickLateness -benchtime 20x ./internal/scheduler
func BenchmarkTickLateness(b *testing.B) {
	const schedules = 100
	b.Run("lockstep_3_replicas", func(b *testing.B) {
		srv := redistest.Start(b)
		var scheds []config.Schedule
		for i := range schedules {
			scheds = append(scheds, sched(fmt.Sprintf("bench-%03d", i), "* * * * * *", config.CatchUpSkip))
		}
		c := testConfig(0, 2*time.Second, scheds...)
		l := newLatencies()
		hook := func(e event) {
			if e.Result == ResultEnqueued {
				l.add(e.Tick, e.Lateness)
			}
		}
		for i := range 3 {
			replica(b, srv, c, nil, fmt.Sprint("bench-", i), withHooks(hooks{event: hook}))
		}
		l.run(b, schedules)
	})
	b.Run("asynq_no_claim", func(b *testing.B) {
		srv := redistest.Start(b)
		client := asynq.NewClientFromRedisClient(srv.Client())
		l := newLatencies()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		b.Cleanup(func() { cancel(); wg.Wait() })
		spec, _ := ParseSpec("* * * * * *", nil)
		for i := range schedules {
			wg.Go(func() {
				for t := spec.Next(time.Now()); ; t = spec.Next(t) {
					tm := time.NewTimer(time.Until(t))
					select {
					case <-ctx.Done():
						tm.Stop()
						return
					case <-tm.C:
					}
					_, err := client.EnqueueContext(ctx, asynq.NewTask("test:tick", []byte(`{"n":1}`)),
						asynq.TaskID(TaskID(fmt.Sprintf("plain-%03d", i), t)), asynq.Retention(time.Hour))
					if err == nil {
						l.add(t, time.Since(t))
					}
				}
			})
		}
		l.run(b, schedules)
	})
}

// latencies collects lateness samples per tick.
type latencies struct {
	mu      sync.Mutex
	perTick map[int64]int
	samples []time.Duration
	changed chan struct{}
}

func newLatencies() *latencies {
	return &latencies{perTick: map[int64]int{}, changed: make(chan struct{}, 1)}
}

func (l *latencies) add(tick time.Time, late time.Duration) {
	l.mu.Lock()
	l.perTick[tick.Unix()]++
	l.samples = append(l.samples, late)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// wait returns once n schedules enqueued tick, and fails after 5s.
func (l *latencies) wait(b *testing.B, tick time.Time, n int) {
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		got := l.perTick[tick.Unix()]
		l.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-l.changed:
		case <-deadline.C:
			b.Fatalf("tick %v: %d of %d schedules enqueued within 5s", tick, got, n)
		}
	}
}

// run measures b.N seconds of ticks after one second of warm-up and
// reports p50, p99 and max lateness.
func (l *latencies) run(b *testing.B, schedules int) {
	spec, _ := ParseSpec("* * * * * *", nil)
	l.wait(b, spec.Next(time.Now()), schedules) // warm up: connections, scripts loaded
	l.mu.Lock()
	l.samples = l.samples[:0]
	l.mu.Unlock()

	b.ResetTimer()
	tick := spec.Next(time.Now())
	for range b.N {
		l.wait(b, tick, schedules)
		tick = spec.Next(tick)
	}
	b.StopTimer()

	l.mu.Lock()
	s := slices.Clone(l.samples)
	l.mu.Unlock()
	slices.Sort(s)
	if len(s) == 0 {
		b.Fatal("no samples")
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(s[len(s)/2]), "p50-ms")
	b.ReportMetric(ms(s[(len(s)-1)*99/100]), "p99-ms")
	b.ReportMetric(ms(s[len(s)-1]), "max-ms")
	b.ReportMetric(float64(len(s))/float64(b.N), "ticks/op")
}
