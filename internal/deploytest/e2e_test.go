package deploytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// e2eScheduler runs three schedules every second: two on order e2e-1, whose
// jobs are due at the same moment and so contend for its lock, and one on
// order e2e-2 whose job outlives the lock TTL (the worker's 1s) and so is
// renewed. Redis comes from LOCKSTEP_REDIS_ADDR.
const e2eScheduler = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: info
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: 1s
  task_retention: 1h
schedules:
  - name: e2e-pay-1
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "e2e-1", "work_ms": 400}
    catch_up: skip
  - name: e2e-pay-1-again
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "e2e-1", "work_ms": 300}
    catch_up: skip
  - name: e2e-pay-2
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "e2e-2", "work_ms": 1200}
    catch_up: skip
`

// e2eWorker: a 1s lock TTL renewed every third of it, quick contention
// backoff, the demo job.
const e2eWorker = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: info
lock:
  ttl: 1s
worker:
  concurrency: 4
  shutdown_timeout: 2s
  contention_backoff_min: 50ms
  contention_backoff_max: 500ms
  demo: true
`

// TestDeployQueriesEndToEnd builds the scheduler and worker binaries, runs two
// of each against a private Redis with schedules that enqueue demo jobs every
// second, and lets a real Prometheus scrape them with the alert rules loaded.
// Once jobs were processed, locks renewed and contended and ticks enqueued,
// every dashboard query and alert expression must evaluate through the HTTP
// API, every panel and variable must return data, and every rule group must
// load with every rule healthy.
func TestDeployQueriesEndToEnd(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	root := Root(t)
	srv := redistest.Start(t)
	bins := buildBinaries(t, root, "scheduler", "worker")
	built := time.Now()

	configs := map[string]string{"scheduler": e2eScheduler, "worker": e2eWorker}
	for role, text := range configs {
		configs[role] = proctest.WriteFile(t, role+".yaml", text)
	}
	env := []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr}
	var procs []*binProc
	for _, role := range []string{"scheduler", "scheduler", "worker", "worker"} {
		procs = append(procs, startBinary(t, bins[role], role, env, "--config", configs[role]))
	}
	targets := map[string][]string{}
	for _, p := range procs {
		targets[p.role] = append(targets[p.role], p.metricsAddr(t, 15*time.Second))
	}
	started := time.Now()

	p := StartPrometheus(t, Options{
		Scrapes: []Scrape{
			{Job: "lockstep-scheduler", Targets: targets["scheduler"]},
			{Job: "lockstep-worker", Targets: targets["worker"]},
		},
		RuleFiles: []string{filepath.Join(root, "deploy", "prometheus", "alerts.yml")},
		Interval:  time.Second,
	})

	// Activity that the panels show, as Prometheus sees it.
	for _, expr := range []string{
		`sum(lockstep_scheduler_ticks_total{job="lockstep-scheduler", result="enqueued"}) >= 3`,
		`sum(lockstep_jobs_processed_total{job="lockstep-worker", type="demo:order.pay", result="success"}) >= 3`,
		`sum(lockstep_lock_renewals_total{job="lockstep-worker", result="renewed"}) > 0`,
		`sum(lockstep_job_contended_total{job="lockstep-worker", type="demo:order.pay"}) > 0`,
		`sum(lockstep_lock_acquire_total{job="lockstep-worker", result="busy"}) > 0`,
		`max(asynq_queue_size{job="lockstep-worker", queue="default"})`,
	} {
		waitQuery(t, p, expr, 30*time.Second)
	}
	p.WaitScraped(t, 3)
	active := time.Now()

	// The demo jobs recorded their executions in Redis too.
	c := srv.Client()
	execs, err := c.XRange(context.Background(), demo.Stream("lockstep:"), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	for _, m := range execs {
		outcomes[fmt.Sprint(m.Values["outcome"])]++
	}
	if outcomes[demo.OutcomeOK] == 0 {
		t.Errorf("demo executions stream: outcomes %v, want some %q", outcomes, demo.OutcomeOK)
	}

	d, rules := loadDeployQueries(t)
	queries := append(d.Queries(), rules.Queries()...)
	p.CheckQueries(t, queries)
	if testing.Verbose() {
		logResults(t, p, queries)
	}

	// Every group of alerts.yml is loaded with all its rules, each healthy.
	loaded := map[string][]string{}
	for _, r := range p.Rules(t) {
		loaded[r.Group] = append(loaded[r.Group], r.Name)
		if r.Health != "ok" {
			t.Errorf("rule %s in group %s: health %s: %s", r.Name, r.Group, r.Health, r.LastError)
		}
	}
	for _, g := range rules.Groups {
		var want []string
		for _, r := range g.Rules {
			want = append(want, r.Name())
		}
		if got := loaded[g.Name]; !slices.Equal(got, want) {
			t.Errorf("rule group %s: Prometheus loaded %v, want %v", g.Name, got, want)
		}
		delete(loaded, g.Name)
	}
	for g := range loaded {
		t.Errorf("Prometheus loaded rule group %s, which alerts.yml lacks", g)
	}

	t.Logf("timings: build %v, processes up %v, activity seen %v, total %v; %d demo executions %v",
		built.Sub(begin).Round(time.Millisecond), started.Sub(built).Round(time.Millisecond),
		active.Sub(started).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), len(execs), outcomes)
}

// logResults logs what each query returns, for reading with -v.
func logResults(t *testing.T, p *Prometheus, qs []Query) {
	t.Helper()
	for _, q := range qs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := p.Query(ctx, q.Expr)
		cancel()
		if err != nil {
			continue // CheckQueries reported it
		}
		var vals []string
		for _, s := range r.Series {
			vals = append(vals, s.Value)
		}
		t.Logf("%s: %d series %v", q.Source, len(r.Series), vals)
	}
}

// waitQuery waits until expr returns at least one series.
func waitQuery(t *testing.T, p *Prometheus, expr string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	defer func() {
		if last != "" {
			t.Logf("%s, last answer: %s", expr, last)
		}
	}()
	redistest.WaitEvery(t, timeout, p.interval/4, "data for "+expr, func() bool {
		r, err := p.Query(ctx, expr)
		if err == nil && len(r.Series) > 0 {
			last = ""
			return true
		}
		last = fmt.Sprintf("error %v, result %+v", err, r)
		return false
	})
}

// buildBinaries builds ./cmd/<name> for each name into one temporary
// directory (proctest.Build) and returns their paths by name.
func buildBinaries(t *testing.T, root string, names ...string) map[string]string {
	t.Helper()
	var pkgs []string
	for _, n := range names {
		pkgs = append(pkgs, filepath.Join(root, "cmd", n))
	}
	bins, err := proctest.Build(proctest.TempDir(t), pkgs...)
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// binProc is a running Lockstep binary and the JSON log it writes.
type binProc struct {
	*proctest.Proc
	role string
	log  proctest.Log
}

// startBinary starts bin with args and only the environment env (plus
// PATH), and kills it when the test ends, showing its last lines if the test
// failed.
func startBinary(t *testing.T, bin, role string, env []string, args ...string) *binProc {
	t.Helper()
	p := &binProc{role: role}
	p.Proc = proctest.Start(t, proctest.Spec{What: role, Bin: bin, Args: args,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...), Output: &p.log})
	return p
}

// metricsAddr waits for the address the metrics server listens on.
func (p *binProc) metricsAddr(t *testing.T, timeout time.Duration) string {
	t.Helper()
	rec := p.log.Wait(t, 0, timeout, p.Exited(), "the "+p.role+"'s metrics server", func(m map[string]any) bool {
		return m["msg"] == "metrics server listening" && m["addr"] != ""
	})
	return rec["addr"].(string)
}
