package asynqmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

func TestQueueCollectorReadsAsynq(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	opt := asynq.RedisClientOpt{Addr: srv.Addr}
	client := asynq.NewClient(opt)
	defer client.Close()
	for range 2 {
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q1")); err != nil {
			t.Fatal(err)
		}
	}
	inspector := asynq.NewInspector(opt)
	defer inspector.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewQueueCollector(inspector, nil))
	want := `
# HELP asynq_queue_size Number of tasks in a queue
# TYPE asynq_queue_size gauge
asynq_queue_size{queue="q1"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "asynq_queue_size"); err != nil {
		t.Fatal(err)
	}

	srv.Kill()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "asynq_queue_size"); err != nil {
		t.Fatalf("with Redis down, the last values are kept: %v", err)
	}
}

// A scrape never waits on a Redis that hangs: it answers within the wait
// bound with the last values, and their age grows.
func TestQueueCollectorDoesNotWaitOnAHungRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	inspector := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr, ReadTimeout: 3 * time.Second})
	defer inspector.Close()
	c := NewQueueCollector(inspector, nil)
	c.MinInterval = time.Millisecond
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	var ages []float64
	for range 3 {
		start := time.Now()
		mfs, err := reg.Gather()
		if took := time.Since(start); err != nil || took > time.Second {
			t.Fatalf("gather with Redis paused: %v after %v; want an answer within 1s", err, took)
		}
		for _, mf := range mfs {
			if mf.GetName() == "lockstep_queue_metrics_age_seconds" {
				ages = append(ages, mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(ages) != 3 || !(ages[2] > ages[0]) {
		t.Fatalf("ages %v, want three growing ages", ages)
	}
	srv.Resume()
	resumed = true
	// The refresh under way ends once Redis answers (goleak checks it).
	redistest.WaitFor(t, 10*time.Second, "a fresh refresh", func() bool {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "lockstep_queue_metrics_age_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue() < 0.5
			}
		}
		return false
	})
}
