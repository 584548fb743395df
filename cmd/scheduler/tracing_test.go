package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/jaegertest"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// traceSchedule ticks every second a demo job that works 1.5 s on one
// order: from the second tick on, each run finds the order's lock held,
// waits among its waiters and is handed the lock by the run before it.
const traceSchedule = `
scheduler:
  task_retention: 1h
schedules:
  - name: settle
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "hot", "work_ms": 1500}
    max_retry: 3
`

const traceWorkerYAML = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
lock:
  ttl: 2s
worker:
  concurrency: 4
  shutdown_timeout: 2s
  contention_backoff_min: 10ms
  contention_backoff_max: 200ms
`

const (
	traceResource = "lock:order:hot"
	// traceTimeout bounds each wait for spans to reach Jaeger: a batch
	// every 100 ms (OTEL_BSP_SCHEDULE_DELAY) from each process, and the
	// run that the spans are of.
	traceTimeout = 30 * time.Second
)

// The real binaries export their spans over OTLP/HTTP to a real Jaeger,
// and its query API shows them as one trace per tick: the scheduler's
// lockstep.tick → lockstep.enqueue (producer), the worker's lockstep.job
// (consumer) under it through the task's headers, and the job's
// lockstep.lock.wait and lockstep.lock.hold. On the hot order a run handed
// the lock links to the hold that handed it on (in another tick's trace);
// `lockstep unlock --force` of a held lock is a lockstep.lock.lost event on
// its hold, which ends lost with the reason.
func TestTicksTracedIntoJaeger(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	jg := jaegertest.Start(t)
	env := append(os.Environ(), "LOCKSTEP_REDIS_ADDR="+srv.Addr, "GORACE=atexit_sleep_ms=0",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+jg.OTLPEndpoint, "OTEL_BSP_SCHEDULE_DELAY=100")
	wcfg := proctest.WriteFile(t, "worker.yaml", traceWorkerYAML)
	for i := range 2 {
		w := &proc{t: t}
		w.Proc = proctest.Start(t, proctest.Spec{What: fmt.Sprintf("worker %d", i), Bin: bins["worker"],
			Args: []string{"--config", wcfg}, Output: &w.log, Env: env})
		w.waitLog("metrics server listening", 10*time.Second)
	}
	s := &proc{t: t}
	s.Proc = proctest.Start(t, proctest.Spec{What: "scheduler", Bin: bins["scheduler"], Output: &s.log, Env: env,
		Args: []string{"--config", writeConfig(t, srv.Addr, traceSchedule), "--http-addr", "127.0.0.1:0"}})
	s.waitStatus("/readyz", 200, 10*time.Second)
	began := time.Now()

	// One tick's trace, whole.
	var tick, enqueue, job, wait, hold jaegertest.Span
	var tr jaegertest.Trace
	waitTrace(t, jg, "a tick's trace from the tick to the hold of its run", func(c jaegertest.Trace) bool {
		var ok bool
		tick, enqueue, job, wait, hold, ok = tickTree(c, func(jaegertest.Span) bool { return true })
		tr = c
		return ok
	})
	t.Logf("a tick's whole trace in Jaeger %v after the scheduler was ready", time.Since(began).Round(time.Millisecond))
	checkTickTree(t, tr, tick, enqueue, job, wait, hold)

	// A hand-off: a run handed the lock links to the hold that handed it
	// on, in the trace of an earlier tick; the same task's first delivery
	// found the lock busy and ended requeued, its wait with its position.
	var handed, handedWait jaegertest.Span
	waitTrace(t, jg, "a run handed the lock on the hot order", func(c jaegertest.Trace) bool {
		var ok bool
		_, _, handed, handedWait, _, ok = tickTree(c, func(j jaegertest.Span) bool { return len(j.Links()) > 0 })
		tr = c
		return ok
	})
	if got := handedWait.Tag(string(tracing.AttrHandedOff)); got != "true" {
		t.Errorf("the handed-on run's wait: %s = %q, want true", tracing.AttrHandedOff, got)
	}
	requeued := tr.Find(tracing.SpanJob, jaegertest.With(string(tracing.AttrOutcome), "requeued"),
		jaegertest.With(string(tracing.AttrTaskID), handed.Tag(string(tracing.AttrTaskID))))
	if len(requeued) == 0 {
		t.Errorf("trace %s: no delivery of %s that ended requeued before the hand-off", tr.TraceID, handed.Tag(string(tracing.AttrTaskID)))
	} else if parked := tr.Find(tracing.SpanLockWait, jaegertest.ChildOf(requeued[0])); len(parked) != 1 ||
		parked[0].Tag(string(tracing.AttrOutcome)) != tracing.WaitRequeued || parked[0].Tag(string(tracing.AttrPosition)) == "" {
		t.Errorf("the requeued delivery's waits %+v, want one, requeued, with its position", parked)
	}
	link := handed.Links()[0]
	if link.TraceID == handed.TraceID {
		t.Errorf("the hand-off links to a span of its own trace %s, want the handing run's", link.TraceID)
	}
	var handing jaegertest.Span
	waitFor(t, traceTimeout, "the hold that handed the lock on, span "+link.SpanID, func() bool {
		other, err := jg.Trace(context.Background(), link.TraceID)
		var ok bool
		if err == nil {
			handing, ok = other.Span(link.SpanID)
		}
		return ok
	})
	if handing.OperationName != tracing.SpanLockHold || handing.Tag(string(tracing.AttrOutcome)) != tracing.HoldHandedOff ||
		handing.Tag(string(tracing.AttrResource)) != traceResource {
		t.Errorf("the hand-off links to %s (%s = %q, %s = %q), want a %s on %s that ended %s", handing.OperationName,
			tracing.AttrOutcome, handing.Tag(string(tracing.AttrOutcome)), tracing.AttrResource, handing.Tag(string(tracing.AttrResource)),
			tracing.SpanLockHold, traceResource, tracing.HoldHandedOff)
	}

	// A loss: the operator breaks the held lock.
	fence := unlockHeld(t, srv.Addr, traceResource)
	var lost jaegertest.Span
	waitTrace(t, jg, "the hold of fence "+fence+" ended lost", func(c jaegertest.Trace) bool {
		holds := c.Find(tracing.SpanLockHold, jaegertest.With(string(tracing.AttrFence), fence),
			jaegertest.With(string(tracing.AttrResource), traceResource))
		if len(holds) == 1 {
			lost, tr = holds[0], c
		}
		return len(holds) == 1
	})
	if got := lost.Tag(string(tracing.AttrOutcome)); got != tracing.HoldLost {
		t.Errorf("the broken hold ended %q, want %s", got, tracing.HoldLost)
	}
	ev, ok := lost.Event(tracing.EventLockLost)
	if !ok {
		t.Fatalf("the broken hold has no %s event: %+v", tracing.EventLockLost, lost.Logs)
	}
	// The key is gone (expired), or, should the next holder take it before
	// the holder's watchdog looks, another's (stolen).
	reason := ev.Field(string(tracing.AttrReason))
	if (reason != string(lock.ReasonExpired) && reason != string(lock.ReasonStolen)) || lost.Tag(string(tracing.AttrReason)) != reason {
		t.Errorf("loss event reason %q, hold's %q; want %s or %s on both", reason, lost.Tag(string(tracing.AttrReason)), lock.ReasonExpired, lock.ReasonStolen)
	}
	if j, ok := tr.Span(lost.Parent()); !ok || j.OperationName != tracing.SpanJob || j.Tag(string(tracing.AttrOutcome)) != jobs.ResultLockLost {
		t.Errorf("the broken hold's parent %+v, want its job span, ended lock_lost", j)
	}
	t.Logf("hold of fence %s lost (%s) on unlock; the test took %v", fence, reason, time.Since(began).Round(time.Millisecond))
}

// tickTree finds in c a tick enqueued by the scheduler, its enqueue, and a
// run of its task that keep accepts with its wait and its hold, each the
// only one of its kind under its parent; ok is false while the trace is
// not complete.
func tickTree(c jaegertest.Trace, keep func(jaegertest.Span) bool) (tick, enqueue, job, wait, hold jaegertest.Span, ok bool) {
	one := func(spans []jaegertest.Span) (jaegertest.Span, bool) {
		if len(spans) != 1 {
			return jaegertest.Span{}, false
		}
		return spans[0], true
	}
	if tick, ok = one(c.Find(tracing.SpanTick, jaegertest.With(string(tracing.AttrOutcome), tracing.TickEnqueued))); !ok {
		return
	}
	if enqueue, ok = one(c.Find(tracing.SpanEnqueue, jaegertest.ChildOf(tick))); !ok {
		return
	}
	for _, j := range c.Find(tracing.SpanJob, jaegertest.ChildOf(enqueue), jaegertest.With(string(tracing.AttrOutcome), jobs.ResultSuccess), keep) {
		w, okWait := one(c.Find(tracing.SpanLockWait, jaegertest.ChildOf(j)))
		h, okHold := one(c.Find(tracing.SpanLockHold, jaegertest.ChildOf(j)))
		if okWait && okHold {
			return tick, enqueue, j, w, h, true
		}
	}
	return tick, enqueue, job, wait, hold, false
}

// checkTickTree checks the spans and attributes of one tick's trace.
func checkTickTree(t *testing.T, tr jaegertest.Trace, tick, enqueue, job, wait, hold jaegertest.Span) {
	t.Helper()
	for _, s := range []jaegertest.Span{tick, enqueue, job, wait, hold} {
		if s.TraceID != tr.TraceID {
			t.Errorf("%s in trace %s, want the tick's %s", s.OperationName, s.TraceID, tr.TraceID)
		}
		service := "lockstep-worker"
		if s.OperationName == tracing.SpanTick || s.OperationName == tracing.SpanEnqueue {
			service = "lockstep-scheduler"
		}
		if got := tr.Service(s); got != service {
			t.Errorf("%s sent by %q, want %s", s.OperationName, got, service)
		}
	}
	if tick.Parent() != "" {
		t.Errorf("the tick's parent %s, want a root", tick.Parent())
	}
	at, err := time.Parse(time.RFC3339, tick.Tag(string(tracing.AttrTick)))
	if err != nil {
		t.Errorf("%s: %v", tracing.AttrTick, err)
	}
	id := scheduler.TaskID("settle", at)
	want := func(s jaegertest.Span, kv ...string) {
		t.Helper()
		for i := 0; i+1 < len(kv); i += 2 {
			if got := s.Tag(kv[i]); got != kv[i+1] {
				t.Errorf("%s: %s = %q, want %q", s.OperationName, kv[i], got, kv[i+1])
			}
		}
	}
	want(tick, string(tracing.AttrSchedule), "settle", string(tracing.AttrOutcome), tracing.TickEnqueued)
	if tick.Tag(string(tracing.AttrReplica)) == "" {
		t.Errorf("the tick has no %s", tracing.AttrReplica)
	}
	want(enqueue, "span.kind", "producer", string(tracing.AttrMessagingDestination), "default", string(tracing.AttrTaskID), id)
	want(job, "span.kind", "consumer", string(tracing.AttrMessagingDestination), "default", string(tracing.AttrTaskID), id,
		string(tracing.AttrTaskType), "demo:order.pay")
	if job.Tag(string(tracing.AttrAttempt)) == "" {
		t.Errorf("the job has no %s", tracing.AttrAttempt)
	}
	want(wait, string(tracing.AttrResource), traceResource, string(tracing.AttrOutcome), tracing.WaitAcquired)
	want(hold, string(tracing.AttrResource), traceResource)
	if o := hold.Tag(string(tracing.AttrOutcome)); o != tracing.HoldReleased && o != tracing.HoldHandedOff {
		t.Errorf("the hold ended %q, want %s or %s", o, tracing.HoldReleased, tracing.HoldHandedOff)
	}
	if f := hold.Tag(string(tracing.AttrFence)); f == "" || f == "0" {
		t.Errorf("the hold's fence %q, want the lease's", f)
	}
	if wait.StartTime+wait.Duration > hold.StartTime {
		t.Errorf("the wait ended at %d µs, after the hold began at %d µs", wait.StartTime+wait.Duration, hold.StartTime)
	}
}

// waitTrace polls Jaeger's tick traces until match accepts one.
func waitTrace(t *testing.T, jg *jaegertest.Server, what string, match func(jaegertest.Trace) bool) {
	t.Helper()
	var lastErr error
	var ts []jaegertest.Trace
	found := false
	defer func() {
		if found {
			return
		}
		oldest := "none"
		if len(ts) > 0 {
			oldest = describe(ts[0])
		}
		t.Logf("%d tick traces in Jaeger, the oldest: %s; last error %v", len(ts), oldest, lastErr)
	}()
	redistest.WaitEvery(t, traceTimeout, 200*time.Millisecond, "a trace in Jaeger of "+what, func() bool {
		ts, lastErr = jg.Traces(context.Background(), jaegertest.Query{Service: "lockstep-scheduler", Operation: tracing.SpanTick})
		// Oldest tick first: its runs are the likeliest to be whole.
		slices.SortFunc(ts, func(a, b jaegertest.Trace) int { return cmp.Compare(traceStart(a), traceStart(b)) })
		found = slices.ContainsFunc(ts, match)
		return found
	})
}

// describe lists a trace's spans: id, name, parent, outcome, service.
func describe(tr jaegertest.Trace) string {
	var b strings.Builder
	b.WriteString(tr.TraceID)
	for _, s := range tr.Spans {
		fmt.Fprintf(&b, "\n  %s %s parent %q outcome %q (%s)", s.SpanID, s.OperationName, s.Parent(), s.Tag(string(tracing.AttrOutcome)), tr.Service(s))
	}
	return b.String()
}

// traceStart is a trace's earliest span start (µs).
func traceStart(t jaegertest.Trace) int64 {
	var m int64
	for i, s := range t.Spans {
		if i == 0 || s.StartTime < m {
			m = s.StartTime
		}
	}
	return m
}

// waitFor waits for an observable condition (see redistest.WaitFor).
var waitFor = redistest.WaitFor

var unlockedFence = regexp.MustCompile(`fence above (\d+)`)

// unlockHeld runs `lockstep unlock resource --force --yes` until it breaks
// a held lock (exit 1: not held at that moment) and returns the fence of
// the hold it broke.
func unlockHeld(t *testing.T, redisAddr, resource string) string {
	t.Helper()
	var out string
	waitFor(t, 20*time.Second, "lockstep unlock to break a held "+resource, func() bool {
		var log proctest.Log
		p := proctest.Start(t, proctest.Spec{What: "lockstep unlock", Bin: bins["lockstep"], Output: &log,
			Args: []string{"unlock", resource, "--force", "--yes"}, Env: append(os.Environ(), "LOCKSTEP_REDIS_ADDR="+redisAddr)})
		code, exited := p.Wait(10 * time.Second)
		out = log.String()
		switch {
		case !exited:
			t.Fatalf("lockstep unlock still running after 10s: %s", out)
		case code == 0:
			return true
		case code != 1:
			t.Fatalf("lockstep unlock: exit %d: %s", code, out)
		}
		return false
	})
	m := unlockedFence.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("lockstep unlock said %q, with no fence", strings.TrimSpace(out))
	}
	return m[1]
}
