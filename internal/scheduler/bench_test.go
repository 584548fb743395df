package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

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
		c := testConfig(0, 2*time.Second, numberedScheds(schedules, "bench-%03d", "* * * * * *")...)
		bl := newBursts()
		hook := func(e event) {
			if e.Result == ResultEnqueued {
				bl.add(e.Schedule, e.Tick, e.Lateness)
			}
		}
		for i := range 3 {
			benchReplica(b, srv, c, i, hook)
		}
		bl.runSeconds(b, schedules)
	})
	b.Run("asynq_no_claim", func(b *testing.B) {
		srv := redistest.Start(b)
		client := asynq.NewClientFromRedisClient(srv.Client())
		bl := newBursts()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		b.Cleanup(func() { cancel(); wg.Wait() })
		spec, _ := ParseSpec("* * * * * *", nil)
		for i := range schedules {
			name := fmt.Sprintf("plain-%03d", i)
			wg.Go(func() {
				everyTick(ctx, spec, func(t time.Time) {
					_, err := client.EnqueueContext(ctx, asynq.NewTask("test:tick", []byte(`{"n":1}`)),
						asynq.TaskID(TaskID(name, t)), asynq.Retention(time.Hour))
					if err == nil {
						bl.add(name, t, time.Since(t))
					}
				})
			})
		}
		bl.runSeconds(b, schedules)
	})
}
