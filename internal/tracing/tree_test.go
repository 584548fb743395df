package tracing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/internal/tracing"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

// recorder is one process's tracer provider, exporting to memory.
type recorder struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newRecorder(t *testing.T) *recorder {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &recorder{exp: exp, tp: tp}
}

// spans are the ended spans named name for which keep holds.
func (r *recorder) spans(name string, keep func(tracetest.SpanStub) bool) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if s.Name == name && (keep == nil || keep(s)) {
			out = append(out, s)
		}
	}
	return out
}

// waitSpan waits for the first ended span named name for which keep holds.
func (r *recorder) waitSpan(t *testing.T, name string, keep func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	redistest.WaitFor(t, 15*time.Second, "span "+name, func() bool {
		found = r.spans(name, keep)
		return len(found) > 0
	})
	return found[0]
}

func attr(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func with(k attribute.Key, v string) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return attr(s, k).Emit() == v }
}

func childOf(parent tracetest.SpanStub) func(tracetest.SpanStub) bool {
	return func(s tracetest.SpanStub) bool { return s.Parent.SpanID() == parent.SpanContext.SpanID() }
}

func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k).Emit(); got != v {
			t.Errorf("%s: %s = %q, want %q", s.Name, k, got, v)
		}
	}
}

// startWorker starts a jobs server with its own Redis client, locker and
// watchdog, as a worker process has, running concurrency tasks at once and
// tracing to rec.
func startWorker(t *testing.T, srv *redistest.Server, rec *recorder, concurrency int, specs ...jobs.Spec) *metrics.Metrics {
	t.Helper()
	c := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	l := lock.New(c)
	m := metrics.New(nil)
	reg, err := jobs.NewRegistry(specs)
	if err != nil {
		t.Fatal(err)
	}
	wd := watchdog.New(watchdog.Options{Metrics: m})
	s := jobs.NewServer(jobs.Params{Client: c, Locker: l, Watchdog: wd, Registry: reg, Metrics: m, Tracing: rec.tp,
		Config: jobs.Config{
			Concurrency: concurrency, ShutdownTimeout: 2 * time.Second, LockTTL: 2 * time.Second,
			Backoff: backoff.Jitter{Min: 3 * time.Second, Max: 10 * time.Second}, PollInterval: 50 * time.Millisecond,
		}})
	if err := wd.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("jobs stop: %v", err)
		}
		if err := wd.Stop(ctx); err != nil {
			t.Errorf("watchdog stop: %v", err)
		}
	})
	return m
}

// exemplars are the trace ids of the exemplars of histogram h.
func exemplars(t *testing.T, h prometheus.Histogram) []string {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range m.GetHistogram().GetBucket() {
		for _, l := range b.GetExemplar().GetLabel() {
			if l.GetName() == "trace_id" {
				ids = append(ids, l.GetValue())
			}
		}
	}
	return ids
}

// orderSpec locks lock:order:<order_id> and runs run.
func orderSpec(run func(ctx context.Context, job jobs.Job) error) jobs.Spec {
	return jobs.Spec{
		Type: "test:order",
		Decode: func(b []byte) (any, error) {
			var p struct {
				OrderID string `json:"order_id"`
			}
			err := json.Unmarshal(b, &p)
			return p.OrderID, err
		},
		Resource: func(p any) string { return "lock:order:" + p.(string) },
		Run:      func(ctx context.Context, job jobs.Job, _ any) error { return run(ctx, job) },
	}
}

// One tick's trace crosses from the scheduler to the worker in the task's
// headers: tick → enqueue (producer) → job (consumer) → wait and hold, one
// trace id, each process exporting its own spans.
func TestTickTraceReachesTheHold(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	sched, work := newRecorder(t), newRecorder(t)
	var handlerSpan sync.Map // task id → the span context the handler saw
	// One task at a time: the ticks' tasks, on one order, never contend.
	wm := startWorker(t, srv, work, 1, orderSpec(func(ctx context.Context, job jobs.Job) error {
		handlerSpan.Store(job.ID, trace.SpanContextFromContext(ctx))
		return nil
	}))

	sm := metrics.New(nil)
	cfg := config.DefaultScheduler()
	cfg.Scheduler.TaskRetention = time.Hour
	cfg.Schedules = []config.Schedule{{
		Name: "settle", Cron: "* * * * * *", Timezone: "UTC", Task: "test:order", Payload: json.RawMessage(`{"order_id":"42"}`),
		Queue: "default", MaxRetry: 3, CatchUp: config.CatchUpSkip,
	}}
	s, err := scheduler.New(srv.Client(), cfg, scheduler.WithReplicaID("r0"), scheduler.WithTracerProvider(sched.tp),
		scheduler.WithMetrics(sm))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})

	job := work.waitSpan(t, tracing.SpanJob, with(tracing.AttrOutcome, jobs.ResultSuccess))
	id := attr(job, tracing.AttrTaskID).Emit()
	tick := sched.waitSpan(t, tracing.SpanTick, func(s tracetest.SpanStub) bool {
		return s.SpanContext.TraceID() == job.SpanContext.TraceID()
	})
	enqueue := sched.waitSpan(t, tracing.SpanEnqueue, childOf(tick))

	at, err := time.Parse(time.RFC3339, attr(tick, tracing.AttrTick).Emit())
	if err != nil {
		t.Fatalf("lockstep.tick: %v", err)
	}
	if want := scheduler.TaskID("settle", at); id != want {
		t.Errorf("job's task id %q, want the tick's %q", id, want)
	}
	if tick.Parent.IsValid() {
		t.Errorf("tick span has parent %v, want a root", tick.Parent.SpanID())
	}
	wantAttrs(t, tick, map[attribute.Key]string{
		tracing.AttrSchedule: "settle", tracing.AttrReplica: "r0", tracing.AttrOutcome: tracing.TickEnqueued,
	})
	if enqueue.SpanKind != trace.SpanKindProducer || job.SpanKind != trace.SpanKindConsumer {
		t.Errorf("kinds: enqueue %v, job %v; want producer and consumer", enqueue.SpanKind, job.SpanKind)
	}
	if job.Parent.SpanID() != enqueue.SpanContext.SpanID() || !job.Parent.IsRemote() {
		t.Errorf("job's parent %v (remote %v), want the enqueue %v through the headers",
			job.Parent.SpanID(), job.Parent.IsRemote(), enqueue.SpanContext.SpanID())
	}
	wantAttrs(t, job, map[attribute.Key]string{
		tracing.AttrMessagingDestination: "default", tracing.AttrTaskType: "test:order", tracing.AttrAttempt: "1",
	})

	wait := work.waitSpan(t, tracing.SpanLockWait, childOf(job))
	hold := work.waitSpan(t, tracing.SpanLockHold, childOf(job))
	wantAttrs(t, wait, map[attribute.Key]string{
		tracing.AttrResource: "lock:order:42", tracing.AttrOutcome: tracing.WaitAcquired, tracing.AttrHandedOff: "false",
	})
	wantAttrs(t, hold, map[attribute.Key]string{tracing.AttrResource: "lock:order:42", tracing.AttrOutcome: tracing.HoldReleased})
	if f := attr(hold, tracing.AttrFence).AsInt64(); f <= 0 {
		t.Errorf("hold's fence %d, want the lease's", f)
	}
	if wait.EndTime.After(hold.StartTime) {
		t.Errorf("wait ended at %v, after the hold began at %v", wait.EndTime, hold.StartTime)
	}
	if sc, _ := handlerSpan.Load(id); sc.(trace.SpanContext).SpanID() != hold.SpanContext.SpanID() {
		t.Errorf("the handler's context carries span %v, want the hold %v", sc.(trace.SpanContext).SpanID(), hold.SpanContext.SpanID())
	}
	for _, s := range []tracetest.SpanStub{enqueue, job, wait, hold} {
		if s.SpanContext.TraceID() != tick.SpanContext.TraceID() {
			t.Errorf("%s in trace %v, want the tick's %v", s.Name, s.SpanContext.TraceID(), tick.SpanContext.TraceID())
		}
	}

	// The lateness and held histograms carry trace ids as exemplars: once
	// every tick enqueued has run, each is a trace's that was exported.
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	enqueued := len(sched.spans(tracing.SpanTick, with(tracing.AttrOutcome, tracing.TickEnqueued)))
	redistest.WaitFor(t, 15*time.Second, "a job run of every tick", func() bool {
		return len(work.spans(tracing.SpanJob, nil)) >= enqueued
	})
	ticks := map[string]bool{}
	for _, s := range sched.spans(tracing.SpanTick, with(tracing.AttrOutcome, tracing.TickEnqueued)) {
		ticks[s.SpanContext.TraceID().String()] = true
	}
	if ids := exemplars(t, sm.SchedulerTickLateness); len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return !ticks[id] }) {
		t.Errorf("tick lateness exemplars %v, want trace ids of enqueued ticks %v", ids, ticks)
	}
	holds := map[string]bool{}
	for _, s := range work.spans(tracing.SpanLockHold, nil) {
		holds[s.SpanContext.TraceID().String()] = true
	}
	if ids := exemplars(t, wm.LockHeld); len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return !holds[id] }) {
		t.Errorf("lock held exemplars %v, want trace ids of holds %v", ids, holds)
	}
}

// A task that finds its lock busy waits among the waiters: its delivery's
// job span ends requeued, with the wait's position. The holder's release
// hands the lock on: its hold ends handed_off, and the waiter's run (in the
// holder's worker) links to that hold, its wait handed off. Tasks enqueued
// without headers start traces of their own.
func TestHandOffLinksToTheHandingHold(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	work := newRecorder(t)
	holding, release := make(chan struct{}), make(chan struct{})
	startWorker(t, srv, work, 4, orderSpec(func(ctx context.Context, job jobs.Job) error {
		if job.ID == "first" {
			close(holding)
			<-release
		}
		return nil
	}))
	enq := asynq.NewClientFromRedisClient(srv.Client())
	t.Cleanup(func() { _ = enq.Close() })
	for _, id := range []string{"first", "second"} {
		if _, err := enq.Enqueue(asynq.NewTask("test:order", []byte(`{"order_id":"7"}`)), asynq.TaskID(id), asynq.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if id == "first" {
			select {
			case <-holding:
			case <-time.After(10 * time.Second):
				t.Fatal("first not running under its lock")
			}
		}
	}
	requeued := work.waitSpan(t, tracing.SpanJob, with(tracing.AttrOutcome, "requeued"))
	wantAttrs(t, requeued, map[attribute.Key]string{tracing.AttrTaskID: "second"})
	parked := work.waitSpan(t, tracing.SpanLockWait, childOf(requeued))
	wantAttrs(t, parked, map[attribute.Key]string{tracing.AttrOutcome: "requeued", tracing.AttrPosition: "0"})
	close(release)

	isRun := func(id string) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool {
			return attr(s, tracing.AttrTaskID).Emit() == id && attr(s, tracing.AttrOutcome).Emit() == jobs.ResultSuccess
		}
	}
	first := work.waitSpan(t, tracing.SpanJob, isRun("first"))
	second := work.waitSpan(t, tracing.SpanJob, isRun("second"))
	handing := work.waitSpan(t, tracing.SpanLockHold, childOf(first))
	wantAttrs(t, handing, map[attribute.Key]string{tracing.AttrOutcome: tracing.HoldHandedOff})
	if first.Parent.IsValid() || second.Parent.IsValid() {
		t.Errorf("job spans of tasks without headers have parents %v, %v; want roots", first.Parent.SpanID(), second.Parent.SpanID())
	}
	if first.SpanContext.TraceID() == second.SpanContext.TraceID() {
		t.Error("two tasks without headers share a trace")
	}
	if requeued.SpanContext.TraceID() == first.SpanContext.TraceID() {
		t.Error("the waiter's delivery is in the holder's trace")
	}
	if !slices.ContainsFunc(second.Links, func(l sdktrace.Link) bool { return l.SpanContext.SpanID() == handing.SpanContext.SpanID() }) {
		t.Errorf("the handed-on run's links %v do not name the hold %v that handed it on", second.Links, handing.SpanContext.SpanID())
	}
	wait := work.waitSpan(t, tracing.SpanLockWait, childOf(second))
	wantAttrs(t, wait, map[attribute.Key]string{tracing.AttrHandedOff: "true", tracing.AttrOutcome: tracing.WaitAcquired})
	work.waitSpan(t, tracing.SpanLockHold, childOf(second))
}

// A lock deleted under its holder is an event on the hold span at the
// moment the holder's context ends (not at the release), and the hold ends
// lost with the reason.
func TestLossIsAnEventOnTheHold(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	work := newRecorder(t)
	admin := srv.Client()
	var cancelledAt time.Time
	const gap = 500 * time.Millisecond
	startWorker(t, srv, work, 1, orderSpec(func(ctx context.Context, job jobs.Job) error {
		if err := admin.Del(ctx, "lockstep:{lock:order:9}").Err(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			return fmt.Errorf("context not cancelled after the lock was deleted")
		}
		cancelledAt = time.Now()
		// Work on after the loss, so that the release comes well after
		// it: the event must be timed by the loss, not by the release.
		time.Sleep(gap)
		return context.Cause(ctx)
	}))
	enq := asynq.NewClientFromRedisClient(srv.Client())
	t.Cleanup(func() { _ = enq.Close() })
	if _, err := enq.Enqueue(asynq.NewTask("test:order", []byte(`{"order_id":"9"}`)), asynq.TaskID("lost"), asynq.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	job := work.waitSpan(t, tracing.SpanJob, nil)
	hold := work.waitSpan(t, tracing.SpanLockHold, childOf(job))
	wantAttrs(t, job, map[attribute.Key]string{tracing.AttrOutcome: jobs.ResultLockLost})
	wantAttrs(t, hold, map[attribute.Key]string{tracing.AttrOutcome: tracing.HoldLost, tracing.AttrReason: string(lock.ReasonExpired)})
	i := slices.IndexFunc(hold.Events, func(e sdktrace.Event) bool { return e.Name == tracing.EventLockLost })
	if i < 0 {
		t.Fatalf("hold events %v, want %s", hold.Events, tracing.EventLockLost)
	}
	ev := hold.Events[i]
	if !slices.Contains(ev.Attributes, tracing.AttrReason.String(string(lock.ReasonExpired))) {
		t.Errorf("loss event attributes %v, want reason expired", ev.Attributes)
	}
	if d := ev.Time.Sub(cancelledAt); d > gap/2 {
		t.Errorf("loss event %v after the handler saw its context end, want at once (the release came %v after)", d, gap)
	}
	if !strings.Contains(job.Status.Description, "lock lost") {
		t.Errorf("job status %q, want the loss", job.Status.Description)
	}
}

// A trigger, traced, is a tick of its own (replica "trigger") whose enqueue
// the job's span is a child of, through the task's headers.
func TestTriggerIsATickOfItsOwn(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cli, work := newRecorder(t), newRecorder(t)
	startWorker(t, srv, work, 1, orderSpec(func(context.Context, jobs.Job) error { return nil }))
	file := []config.Schedule{{
		Name: "settle", Cron: "0 2 * * *", Timezone: "UTC", Task: "test:order", Payload: json.RawMessage(`{"order_id":"5"}`),
		Queue: "default", MaxRetry: 3, CatchUp: config.CatchUpSkip,
	}}
	id, err := scheduler.NewStore(srv.Client(), "").Traced(cli.tp).Trigger(t.Context(), "settle", file)
	if err != nil {
		t.Fatal(err)
	}
	job := work.waitSpan(t, tracing.SpanJob, with(tracing.AttrTaskID, id))
	tick := cli.waitSpan(t, tracing.SpanTick, nil)
	enqueue := cli.waitSpan(t, tracing.SpanEnqueue, childOf(tick))
	wantAttrs(t, tick, map[attribute.Key]string{
		tracing.AttrSchedule: "settle", tracing.AttrReplica: "trigger", tracing.AttrOutcome: tracing.TickEnqueued,
	})
	if job.Parent.SpanID() != enqueue.SpanContext.SpanID() || job.SpanContext.TraceID() != tick.SpanContext.TraceID() {
		t.Errorf("triggered job's parent %v in trace %v, want the enqueue %v in the trigger's trace %v",
			job.Parent.SpanID(), job.SpanContext.TraceID(), enqueue.SpanContext.SpanID(), tick.SpanContext.TraceID())
	}
}
