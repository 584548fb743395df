package metrics

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

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
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("with Redis down: %d series, %v; want none and no error", n, err)
	}
}
