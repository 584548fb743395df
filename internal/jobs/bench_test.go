package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/benchhold"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// commandCounter counts the Redis commands a client sends, pipelined or not.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// benchRig is one private Redis with a counted client for the server under
// test and an uncounted one for enqueueing.
type benchRig struct {
	client  *redis.Client
	admin   *redis.Client // uncounted: stats
	counter *commandCounter
	enq     *asynq.Client
	metrics *metrics.Metrics
	srv     *Server // the last serveLocked's
	cpuBase time.Duration
	// noticesOn has serveLocked's watchdog keep its loss notices (client
	// tracking) running from the start, as in a process where some hold is
	// always older than NoticeAfter (a long job in another slot); by
	// default they run only while one is.
	noticesOn bool
	// traced has serveLocked trace every job (tracing_bench_test.go).
	traced bool
	spans  *sdktrace.TracerProvider // the traced rig's provider
	// work is how long runThroughput's handler through the middleware
	// works (BenchmarkRateCost); 0: no-op.
	work time.Duration
}

func newBenchRig(b *testing.B) *benchRig {
	rs := redistest.Start(b)
	r := &benchRig{
		client:  rs.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }),
		admin:   rs.Client(),
		counter: &commandCounter{},
		enq:     asynq.NewClientFromRedisClient(rs.Client()),
		metrics: metrics.New(nil),
	}
	r.client.AddHook(r.counter)
	b.Cleanup(func() { _ = r.enq.Close() })
	return r
}

// enqueue adds n tasks of typ whose payload is produced by payload(i).
func (r *benchRig) enqueue(b *testing.B, typ string, n int, payload func(i int) string) {
	for i := range n {
		if _, err := r.enq.Enqueue(asynq.NewTask(typ, []byte(payload(i))), asynq.MaxRetry(3)); err != nil {
			b.Fatal(err)
		}
	}
}

// serveLocked runs handlers behind the lock middleware until stop is called.
func (r *benchRig) serveLocked(b *testing.B, cfg Config, specs ...Spec) (stop func()) {
	reg, err := NewRegistry(specs)
	if err != nil {
		b.Fatal(err)
	}
	// As cmd/worker wires them: the loss notices (client tracking) run
	// while a hold is older than NoticeAfter, or always if the rig says so.
	locker := lock.New(r.client, lock.WithMetrics(r.metrics))
	opts := watchdog.Options{Metrics: r.metrics, Notifier: watchdog.Tracking(r.client, locker.KeyPrefix(), nil)}
	if r.noticesOn {
		opts.NoticeAfter = -1
	}
	wd := watchdog.New(opts)
	if err := wd.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	srv := NewServer(Params{
		Client: r.client, Locker: locker, Watchdog: wd,
		Registry: reg, Metrics: r.metrics, Config: cfg,
		Tracing: r.tracerProvider(b),
	})
	r.srv = srv
	if err := srv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return func() {
		_ = srv.Stop(context.Background())
		_ = wd.Stop(context.Background())
	}
}

// servePlain runs h on a plain asynq server with the same polling as ours;
// contention errors (*ContendedError) are retried after their delay without
// counting a failure, as our server does.
func (r *benchRig) servePlain(b *testing.B, cfg Config, h asynq.HandlerFunc) (stop func()) {
	poll := cfg.withDefaults().PollInterval
	srv := asynq.NewServerFromRedisClient(r.client, asynq.Config{
		Concurrency:              cfg.Concurrency,
		TaskCheckInterval:        poll,
		DelayedTaskCheckInterval: poll,
		LogLevel:                 asynq.ErrorLevel,
		ShutdownTimeout:          time.Second,
		IsFailure:                isFailure,
		RetryDelayFunc:           retryDelay(cfg.Backoff),
	})
	if err := srv.Start(h); err != nil {
		b.Fatal(err)
	}
	return srv.Shutdown
}

func waitDone(b *testing.B, done <-chan struct{}, timeout time.Duration) {
	select {
	case <-done:
	case <-time.After(timeout):
		b.Fatalf("jobs not done within %v", timeout)
	}
}

// counter counts handler runs and closes done at want.
type counter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func newCounter(want int) *counter { return &counter{want: int64(want), done: make(chan struct{})} }

func (c *counter) add() {
	if c.n.Add(1) == c.want {
		close(c.done)
	}
}

// serverStats are counted by the Redis server itself (INFO): every command,
// asynq's and those inside scripts included.
type serverStats struct {
	commands int64
	cpu      time.Duration
}

// resetStats zeroes the server's command count and notes its CPU time.
func (r *benchRig) resetStats(b *testing.B) {
	ctx := context.Background()
	if err := r.admin.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	r.cpuBase = redistest.CPU(b, r.admin)
}

func (r *benchRig) stats(b *testing.B) serverStats {
	n := r.info(b, "stats", "total_commands_processed")
	return serverStats{commands: int64(n) - 1, cpu: redistest.CPU(b, r.admin) - r.cpuBase} // less our INFO
}

func (r *benchRig) info(b *testing.B, section, field string) float64 {
	s, err := r.admin.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	b.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// BenchmarkThroughput compares no-op jobs through the lock middleware (each
// on its own resource: acquire, watchdog hold, release) with the same jobs
// on a plain asynq server, on the same kind of Redis, in one run. The
// middleware runs as cmd/worker wires it ("locked": loss notices start only
// for a hold older than NoticeAfter, so no-op jobs never start them) and with
// the notices running throughout ("locked-notices-on", a process that always
// has a long job in some slot: every lock write is then pushed to it). A
// fourth mode is the floor of any lock that costs a round trip to take and
// one to release: plain asynq whose handler sends SET NX PX and DEL (no
// fence, no watchdog, no hand-off, no notices), so that the middleware's
// figure can be read against what its two round trips cost alone. A fifth,
// "locked-traced", is "locked" with tracing on: a span per job, wait and
// hold, exported in batches by OTLP/HTTP to a local collector stub.
func BenchmarkThroughput(b *testing.B) {
	cfg := Config{Concurrency: 10, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
	modes := []string{"asynq", "asynq-setnx-del", "locked", "locked-notices-on", "locked-traced"}
	// The modes take turns, in rounds of b.N/rounds jobs each (the order
	// rotating), on a Redis of their own: a noisy machine slows them alike,
	// and each round gives a ratio to the asynq run beside it.
	const rounds = 5
	n := max(b.N/rounds, 1)
	rigs := make([]*benchRig, len(modes))
	for i, mode := range modes {
		rigs[i] = newBenchRig(b)
		rigs[i].noticesOn = mode == "locked-notices-on"
		rigs[i].traced = mode == "locked-traced"
	}
	totals := make([]throughputRun, len(modes))
	ratios := make([][]float64, len(modes))
	b.ResetTimer()
	for round := range rounds {
		runs := make([]throughputRun, len(modes))
		for k := range modes {
			i := (k + round) % len(modes)
			runs[i] = rigs[i].runThroughput(b, modes[i], cfg, n)
			totals[i].add(runs[i])
		}
		for i := range modes {
			ratios[i] = append(ratios[i], runs[i].rate()/runs[0].rate())
		}
	}
	b.StopTimer()
	for i, mode := range modes {
		t := totals[i]
		jobs := float64(t.jobs)
		b.ReportMetric(t.rate(), mode+"-jobs/s")
		if i > 0 {
			b.ReportMetric(median(ratios[i]), mode+"-x-asynq")
		}
		b.ReportMetric(float64(t.client)/jobs, mode+"-client-cmds/job")
		b.ReportMetric(float64(t.server)/jobs, mode+"-server-cmds/job")
		b.ReportMetric(t.redisCPU.Seconds()*1e6/jobs, mode+"-redis-cpu-us/job")
		b.ReportMetric(t.goCPU.Seconds()*1e6/jobs, mode+"-go-cpu-us/job")
	}
}

// BenchmarkRateCost is what a rate limit that never binds costs a job: jobs
// through the middleware with and without one, with a lock (each job on its
// own resource) and without, taking turns in rounds on Redises of their own
// as BenchmarkThroughput's modes do; no-op jobs, and jobs of 1 ms of work
// (benchhold.Hold: the same length whatever the load). Every rated job is
// admitted by one key ("tenant", a million a second: a tenant's limit that
// its traffic stays under), so each pays the rate's round trip and nothing
// else. The figure is each rated mode's median ratio to its unrated twin.
func BenchmarkRateCost(b *testing.B) {
	for _, work := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond} {
		name := "noop"
		if work > 0 {
			name = "work=" + work.String()
		}
		b.Run(name, func(b *testing.B) { rateCost(b, work) })
	}
}

func rateCost(b *testing.B, work time.Duration) {
	cfg := Config{Concurrency: 10, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
	modes := []string{"locked", "locked-rated", "unlocked", "unlocked-rated"}
	const rounds = 5
	n := max(b.N/rounds, 1)
	rigs := make([]*benchRig, len(modes))
	for i := range modes {
		rigs[i] = newBenchRig(b)
		rigs[i].work = work
	}
	totals := make([]throughputRun, len(modes))
	ratios := make([][]float64, len(modes))
	b.ResetTimer()
	for round := range rounds {
		runs := make([]throughputRun, len(modes))
		for k := range modes {
			i := (k + round) % len(modes)
			runs[i] = rigs[i].runThroughput(b, modes[i], cfg, n)
			totals[i].add(runs[i])
		}
		for i := 1; i < len(modes); i += 2 {
			ratios[i] = append(ratios[i], runs[i].rate()/runs[i-1].rate())
		}
	}
	b.StopTimer()
	for i, mode := range modes {
		t := totals[i]
		b.ReportMetric(t.rate(), mode+"-jobs/s")
		if i%2 == 1 {
			b.ReportMetric(median(ratios[i]), mode+"-x-unrated")
			b.Logf("%s / %s per round: %.3f", mode, modes[i-1], ratios[i])
		}
		b.ReportMetric(float64(t.server)/float64(t.jobs), mode+"-server-cmds/job")
		b.ReportMetric(t.redisCPU.Seconds()*1e6/float64(t.jobs), mode+"-redis-cpu-us/job")
	}
	for _, r := range rigs {
		if limited := testutil.ToFloat64(r.metrics.RateLimited.WithLabelValues("bench:noop")); limited > 0 {
			b.Fatalf("the limit bound %v times: it was meant not to", limited)
		}
	}
}

// throughputRun is what one run of no-op jobs took.
type throughputRun struct {
	jobs            int
	elapsed         time.Duration
	client, server  int64
	redisCPU, goCPU time.Duration
}

func (t throughputRun) rate() float64 { return float64(t.jobs) / t.elapsed.Seconds() }

func (t *throughputRun) add(o throughputRun) {
	t.jobs += o.jobs
	t.elapsed += o.elapsed
	t.client += o.client
	t.server += o.server
	t.redisCPU += o.redisCPU
	t.goCPU += o.goCPU
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// runThroughput serves n no-op jobs, each on a resource of its own, in
// mode, from the start of the server to the last job's end.
func (r *benchRig) runThroughput(b *testing.B, mode string, cfg Config, n int) throughputRun {
	r.enqueue(b, "bench:noop", n, func(i int) string { return fmt.Sprintf("res-%d", i) })
	c := newCounter(n)
	r.counter.n.Store(0)
	r.resetStats(b)
	cpu0 := proctest.SelfCPU(b)
	began := time.Now()
	var stop func()
	switch mode {
	case "asynq":
		stop = r.servePlain(b, cfg, func(context.Context, *asynq.Task) error { c.add(); return nil })
	case "asynq-setnx-del":
		stop = r.servePlain(b, cfg, func(ctx context.Context, t *asynq.Task) error {
			key := "lockstep:{" + string(t.Payload()) + "}"
			if err := r.client.SetNX(ctx, key, "t", cfg.LockTTL).Err(); err != nil {
				return err
			}
			c.add()
			return r.client.Del(ctx, key).Err()
		})
	default:
		spec := Spec{
			Type:     "bench:noop",
			Decode:   func(p []byte) (any, error) { return string(p), nil },
			Resource: func(p any) string { return p.(string) },
			Run: func(context.Context, Job, any) error {
				if r.work > 0 {
					benchhold.Hold(r.work)
				}
				c.add()
				return nil
			},
		}
		if strings.HasPrefix(mode, "unlocked") {
			spec.Resource = nil
		}
		if strings.HasSuffix(mode, "-rated") { // BenchmarkRateCost: a limit that never binds
			spec.Rate = func(p any) (string, lock.Rate) { return "tenant", lock.Rate{N: 1_000_000, Per: time.Second} }
		}
		stop = r.serveLocked(b, cfg, spec)
	}
	waitDone(b, c.done, 5*time.Minute)
	elapsed := time.Since(began)
	r.flushSpans(b) // exported on this mode's CPU, not the next one's
	run := throughputRun{jobs: n, elapsed: elapsed, client: r.counter.n.Load(), goCPU: proctest.SelfCPU(b) - cpu0}
	st := r.stats(b)
	run.server, run.redisCPU = st.commands, st.cpu
	stop()
	return run
}

// hotRun is one run of jobs on hot resources: what each job did, in the
// order the jobs started.
type hotRun struct {
	mu     sync.Mutex
	starts []hotStart
	since  map[string]float64 // job id -> first contention (Unix ms), from the server's wait hook
	total  int
	done   chan struct{}
}

type hotStart struct {
	id, resource string
	start, end   time.Time
}

func newHotRun(total int) *hotRun {
	return &hotRun{since: map[string]float64{}, total: total, done: make(chan struct{})}
}

func (h *hotRun) waited(job Job, since float64) {
	h.mu.Lock()
	if _, ok := h.since[job.ID]; !ok {
		h.since[job.ID] = since
	}
	h.mu.Unlock()
}

// work runs one job: work long, recorded.
func (h *hotRun) work(id, resource string, work time.Duration) {
	start := time.Now()
	time.Sleep(work)
	h.mu.Lock()
	h.starts = append(h.starts, hotStart{id: id, resource: resource, start: start, end: time.Now()})
	if len(h.starts) == h.total {
		close(h.done)
	}
	h.mu.Unlock()
}

// figures are what the hot-resource benchmarks report.
type figures struct {
	makespan  time.Duration
	serial    time.Duration // sum of the jobs' own run times
	maxSerial time.Duration // the largest per-resource sum
	maxGap    time.Duration // longest idle time of a resource between two of its jobs
	fifoOut   float64       // share of waiting jobs that started after one that first waited later
}

func (h *hotRun) figures(begin time.Time) figures {
	h.mu.Lock()
	defer h.mu.Unlock()
	var f figures
	perRes := map[string]time.Duration{}
	lastEnd := map[string]time.Time{}
	var end time.Time
	for _, s := range h.starts {
		d := s.end.Sub(s.start)
		f.serial += d
		perRes[s.resource] += d
		f.maxSerial = max(f.maxSerial, perRes[s.resource])
		if e, ok := lastEnd[s.resource]; ok {
			f.maxGap = max(f.maxGap, s.start.Sub(e))
		}
		lastEnd[s.resource] = s.end
		if s.end.After(end) {
			end = s.end
		}
	}
	f.makespan = end.Sub(begin)
	// FIFO, per resource: a job is out of order when a job of its resource
	// that first waited later started before it.
	waited, out := 0, 0
	latest := map[string]float64{}
	for _, s := range h.starts {
		since, ok := h.since[s.id]
		if !ok {
			continue
		}
		waited++
		if since < latest[s.resource] {
			out++
		}
		latest[s.resource] = max(latest[s.resource], since)
	}
	if waited > 0 {
		f.fifoOut = float64(out) / float64(waited)
	}
	return f
}

// hotModes are the ways BenchmarkContention and BenchmarkHotResources run
// the same jobs: through the lock middleware with its hand-off (the
// default configuration), the previous design (requeue, woken into the
// pending list by the release, started by an idle worker's poll), a plain
// asynq handler spinning on the lock every 50-100ms, and (the floor) plain
// asynq with no lock at all.
var hotModes = []string{"handoff", "requeue-wake", "spin", "asynq-nolock"}

// serveHot serves jobs of type bench:pay (payload: the resource) in mode.
func (r *benchRig) serveHot(b *testing.B, mode string, cfg Config, h *hotRun, work time.Duration) (stop func()) {
	locker := lock.New(r.client, lock.WithMetrics(r.metrics))
	switch mode {
	case "handoff":
		stop := r.serveLocked(b, cfg, Spec{
			Type:     "bench:pay",
			Decode:   func(p []byte) (any, error) { return string(p), nil },
			Resource: func(p any) string { return p.(string) },
			Run: func(ctx context.Context, job Job, p any) error {
				h.work(job.ID, p.(string), work)
				return nil
			},
		})
		r.srv.hooks.wait = h.waited
		return stop
	case "requeue-wake":
		w := &wakeBaseline{client: r.client, locker: locker, backoff: cfg.Backoff, h: h}
		return r.servePlain(b, cfg, func(ctx context.Context, t *asynq.Task) error { return w.process(ctx, t, work) })
	}
	if mode == "asynq-nolock" {
		return r.servePlain(b, cfg, func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			h.work(id, string(t.Payload()), work)
			return nil
		})
	}
	return r.servePlain(b, cfg, func(ctx context.Context, t *asynq.Task) error {
		lease, err := spinAcquire(ctx, locker, string(t.Payload()))
		if err != nil {
			return err
		}
		id, _ := asynq.GetTaskID(ctx)
		h.work(id, string(t.Payload()), work)
		return lease.Release(ctx)
	})
}

// runHot enqueues perResource jobs on each of resources (interleaved, as
// they would arrive), serves them in mode and returns the figures and the
// server's command count per job.
func (r *benchRig) runHot(b *testing.B, mode string, cfg Config, resources []string, perResource int, work time.Duration) (figures, serverStats) {
	total := len(resources) * perResource
	for i := range total {
		res := resources[i%len(resources)]
		if _, err := r.enq.Enqueue(asynq.NewTask("bench:pay", []byte(res)), asynq.MaxRetry(3)); err != nil {
			b.Fatal(err)
		}
	}
	h := newHotRun(total)
	r.resetStats(b)
	begin := time.Now()
	stop := r.serveHot(b, mode, cfg, h, work)
	waitDone(b, h.done, 5*time.Minute)
	f := h.figures(begin)
	st := r.stats(b)
	stop()
	return f, st
}

// BenchmarkContention runs 200 jobs of 5ms on one order with 8 handler
// slots, in each mode, with the default configuration (poll interval
// 100ms). It reports the makespan against the serial work (the sum of the
// jobs' own run times), the Redis commands per job counted by the server
// (asynq's included) against the same 200 jobs on 200 distinct orders in the
// same mode, and the share of jobs that started out of their first-contention
// order (handoff only: the others keep no order).
func BenchmarkContention(b *testing.B) {
	const jobsN, work = 200, 5 * time.Millisecond
	for _, mode := range hotModes[:3] { // without a lock, one order is not hot
		b.Run(mode, func(b *testing.B) {
			cfg := Config{Concurrency: 8, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
			r := newBenchRig(b)
			var hot, distinct figures
			var hotCmds, distinctCmds int64
			b.ResetTimer()
			for i := range b.N {
				f, st := r.runHot(b, mode, cfg, []string{fmt.Sprintf("lock:order:%d", i)}, jobsN, work)
				hot.makespan += f.makespan
				hot.serial += f.serial
				hot.fifoOut += f.fifoOut
				hotCmds += st.commands
				b.StopTimer()
				res := make([]string, jobsN)
				for j := range res {
					res[j] = fmt.Sprintf("lock:order:%d-%d", i, j)
				}
				f, st = r.runHot(b, mode, cfg, res, 1, work)
				distinct.makespan += f.makespan
				distinctCmds += st.commands
				b.StartTimer()
			}
			n := float64(b.N)
			b.ReportMetric(hot.makespan.Seconds()/n, "s/200jobs")
			b.ReportMetric(hot.makespan.Seconds()/hot.serial.Seconds(), "x-serial")
			b.ReportMetric(float64(hotCmds)/n/jobsN, "server-cmds/job")
			b.ReportMetric(float64(distinctCmds)/n/jobsN, "distinct-server-cmds/job")
			b.ReportMetric(float64(hotCmds)/float64(distinctCmds), "x-distinct-cmds")
			if mode == "handoff" {
				b.ReportMetric(100*hot.fifoOut/n, "fifo-out-%")
			}
		})
	}
}

// BenchmarkHotResources runs 40 jobs of 5ms on each of 50 orders with 16
// handler slots, in each mode: the makespan against the ideal (the larger
// of one order's serial work and all work over the slots), the longest time
// an order sat idle between two of its jobs, and FIFO as above.
func BenchmarkHotResources(b *testing.B) {
	const resN, perRes, work = 50, 40, 5 * time.Millisecond
	for _, mode := range hotModes {
		b.Run(mode, func(b *testing.B) {
			cfg := Config{Concurrency: 16, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
			r := newBenchRig(b)
			var sum figures
			var ideal time.Duration
			b.ResetTimer()
			for i := range b.N {
				res := make([]string, resN)
				for j := range res {
					res[j] = fmt.Sprintf("lock:order:%d-%d", i, j)
				}
				f, _ := r.runHot(b, mode, cfg, res, perRes, work)
				sum.makespan += f.makespan
				sum.maxGap = max(sum.maxGap, f.maxGap)
				sum.fifoOut += f.fifoOut
				ideal += max(f.maxSerial, f.serial/time.Duration(cfg.Concurrency))
			}
			n := float64(b.N)
			b.ReportMetric(sum.makespan.Seconds()/n, "s/2000jobs")
			b.ReportMetric(sum.makespan.Seconds()/ideal.Seconds(), "x-ideal")
			b.ReportMetric(float64(sum.maxGap.Milliseconds()), "max-gap-ms")
			if mode == "handoff" {
				b.ReportMetric(100*sum.fifoOut/n, "fifo-out-%")
			}
		})
	}
}

// spinAcquire is the baseline: try the lock every 50-100ms until it is free.
func spinAcquire(ctx context.Context, l *lock.Locker, resource string) (*lock.Lease, error) {
	for {
		lease, err := l.TryAcquire(ctx, resource, 30*time.Second)
		if !errors.Is(err, lock.ErrNotAcquired) {
			return lease, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50*time.Millisecond + rand.N(50*time.Millisecond)):
		}
	}
}

// wakeBaseline is the previous design, kept here to compare with: a busy
// lock puts the task in the waiters and in asynq's retry set with a backoff
// rounded up to whole seconds; a release moves the longest waiter from the
// retry set to the pending list (wake.lua), where an idle worker's poll
// finds it.
type wakeBaseline struct {
	client  *redis.Client
	locker  *lock.Locker
	backoff backoff.Jitter
	h       *hotRun
}

func (w *wakeBaseline) process(ctx context.Context, t *asynq.Task, work time.Duration) error {
	resource := string(t.Payload())
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	key := w.locker.Key(resource) + ":baseline" // the baseline's own waiters, apart from the one queue
	me := lock.TaskWaiter(queue, id)
	lease, err := w.locker.TryAcquire(ctx, resource, 30*time.Second)
	if errors.Is(err, lock.ErrNotAcquired) {
		w.client.ZAddNX(ctx, key, redis.Z{Score: float64(time.Now().UnixMilli()), Member: me})
		ahead, _ := w.client.ZRank(ctx, key, me).Result()
		return &ContendedError{Resource: resource, Delay: w.backoff.Nth(1 + int(ahead))}
	}
	if err != nil {
		return err
	}
	w.h.work(id, resource, work)
	if err := lease.Release(ctx); err != nil {
		return err
	}
	w.client.ZRem(ctx, key, me)
	for range 5 {
		zs, err := w.client.ZPopMin(ctx, key).Result()
		if err != nil || len(zs) == 0 {
			return nil
		}
		m, _ := zs[0].Member.(string)
		q, wid, ok := lock.ParseTaskWaiter(m)
		if !ok {
			continue
		}
		if v, _ := asynqstore.New(w.client).Wake(ctx, q, wid); v == asynqstore.WokenMoved {
			return nil
		}
	}
	return nil
}
