package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A provider passed among the handlers traces the runs: the handler's
// context is in the trace whose context the task's headers carry, and the
// job span is exported through that provider.
func TestRunTracesWithTheProviderGiven(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
http: {addr: "127.0.0.1:0"}
log: {level: error}
worker: {concurrency: 1, shutdown_timeout: 1s, demo: false}
`, rs.Addr))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	seen := make(chan trace.SpanContext, 1)
	h := Handle("order:pay", func(ctx context.Context, _ Job, _ pay) error {
		seen <- trace.SpanContextFromContext(ctx)
		return nil
	}).Lock(orderLock, 0)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"--config", cfg}, WithTracerProvider(tp), h) }()
	enq := asynq.NewClientFromRedisClient(rs.Client())
	defer enq.Close()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	task := asynq.NewTaskWithHeaders("order:pay", []byte(`{"order_id":"42","cents":5}`),
		map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"})
	if _, err := enq.Enqueue(task, asynq.TaskID("t1")); err != nil {
		t.Fatal(err)
	}
	sc := redistest.Receive(t, seen, 20*time.Second, "the handler to run")
	if sc.TraceID().String() != traceID {
		t.Errorf("the handler's context is in trace %v, want the headers' %s", sc.TraceID(), traceID)
	}
	cancel()
	if err := redistest.Receive(t, done, 10*time.Second, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var names []string
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID().String() == traceID {
			names = append(names, s.Name)
		}
	}
	if len(names) != 3 {
		t.Errorf("spans in the task's trace: %v, want lockstep.job, lockstep.lock.wait and lockstep.lock.hold", names)
	}
}
