package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/worker"
)

// Environment variables of the local run itself; every other LOCKSTEP_*
// variable configures the roles as usual.
const (
	envRedisAddr = "LOCKSTEP_REDIS_ADDR"     // a real Redis instead of the embedded one
	envDuration  = "LOCKSTEP_LOCAL_DURATION" // default of --duration
)

// minCheckedRun is how long a run must last for the check to expect ticks
// and finished jobs.
const minCheckedRun = 5 * time.Second

// errConfig marks flag and configuration errors: exit status 2.
var errConfig = errors.New("invalid configuration")

type options struct {
	duration        time.Duration // 0: until ctx ends
	every           time.Duration // between summary lines
	schedulers      int
	workers         int
	httpPort        int // first port of the roles' HTTP servers; 0: free ports
	schedulerConfig string
	workerConfig    string
	pageAddr        string // where `lockstep ui` serves the operator's page; "" for none
}

// hooks let tests look at a run.
type hooks struct {
	// afterStop runs once every role stopped, before the Redis clients close
	// (and the embedded Redis with them).
	afterStop func(ctx context.Context, c redis.UniversalClient, r result)
}

// result is what a run saw: the schedulers' final counts and the demo
// executions recorded since it started.
type result struct {
	final snapshot
	execs *executions
}

// run is the whole command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, h hooks) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		l := &localRun{opts: o, out: stdout, stderr: stderr, hooks: h,
			http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{}}}
		err = l.run(ctx)
		l.http.CloseIdleConnections()
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errConfig):
		fmt.Fprintln(stderr, "local:", config.OneLine(err))
		return 2
	}
	fmt.Fprintln(stderr, "local:", config.OneLine(err))
	return 1
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 0, "run this long, then stop and exit (0: until Ctrl-C); default from "+envDuration)
	fs.DurationVar(&o.every, "every", 3*time.Second, "print a summary line this often")
	fs.IntVar(&o.schedulers, "schedulers", 2, "scheduler replicas")
	fs.IntVar(&o.workers, "workers", 3, "workers")
	fs.IntVar(&o.httpPort, "http-port", 0, "first port of the roles' /metrics servers on 127.0.0.1, one per role, schedulers first (0: free ports)")
	fs.StringVar(&o.schedulerConfig, "scheduler-config", "configs/local-scheduler.yaml", "the scheduler replicas' configuration")
	fs.StringVar(&o.workerConfig, "worker-config", "configs/local-worker.yaml", "the workers' configuration")
	fs.StringVar(&o.pageAddr, "page-addr", "127.0.0.1:8089", "where the operator's page (lockstep ui, from the lockstep binary next to this one) listens; \"\" for none")
	if v, ok := os.LookupEnv(envDuration); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return o, fmt.Errorf("%w: %s: invalid duration %q", errConfig, envDuration, v)
		}
		o.duration = d
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %v", errConfig, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", errConfig, fs.Arg(0))
	case o.duration < 0:
		return o, fmt.Errorf("%w: --duration must not be negative, got %v", errConfig, o.duration)
	case o.every <= 0:
		return o, fmt.Errorf("%w: --every must be positive, got %v", errConfig, o.every)
	case o.schedulers < 1 || o.workers < 1:
		return o, fmt.Errorf("%w: --schedulers and --workers must be at least 1", errConfig)
	case o.httpPort < 0 || o.httpPort+o.schedulers+o.workers > 65536:
		return o, fmt.Errorf("%w: --http-port %d leaves no room for %d ports", errConfig, o.httpPort, o.schedulers+o.workers)
	}
	return o, nil
}

// localRun is one run: its roles and what it has seen.
type localRun struct {
	opts   options
	out    io.Writer
	stderr io.Writer
	hooks  hooks
	http   *http.Client

	env        func(string) (string, bool) // the roles' LOCKSTEP_* variables
	client     redis.UniversalClient       // the run's own, for the demo stream and the queue
	replicas   []*roleProc
	workers    []*roleProc
	schedulers []source // the replicas' registries, which outlive them
	execs      *executions
}

func (l *localRun) run(ctx context.Context) error {
	addr, external := os.LookupEnv(envRedisAddr)
	if external && addr == "" {
		return fmt.Errorf("%w: %s is empty: unset it for the embedded Redis", errConfig, envRedisAddr)
	}
	if !external {
		e, err := startEmbedded()
		if err != nil {
			return err
		}
		defer e.Close()
		addr = e.Addr()
	}
	// The roles read LOCKSTEP_* as usual; only the Redis address is ours.
	env := func(k string) (string, bool) {
		if k == envRedisAddr {
			return addr, true
		}
		return os.LookupEnv(k)
	}
	scfg, err := scheduler.Load(l.opts.schedulerConfig, "", env)
	if err != nil {
		return configError(err)
	}
	wcfg, err := config.LoadWorker(l.opts.workerConfig, env)
	if err != nil {
		return configError(err)
	}
	// The roles get the run's variables as parameters: nothing is written.
	l.env = env
	if err := (worker.Env{Args: []string{"--config", l.opts.workerConfig}, LookupEnv: env, Stderr: io.Discard}).Check(); err != nil {
		if errors.Is(err, worker.ErrConfig) {
			return fmt.Errorf("%w: %w", errConfig, err)
		}
		return err
	}

	if l.client, err = scfg.Redis.NewClient(); err != nil {
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	defer l.client.Close()
	from, err := streamStart(ctx, l.client)
	if err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", scfg.Redis, err)
	}
	l.execs = newExecutions(l.client, demo.Stream(wcfg.Lock.Prefix), from)

	if l.opts.pageAddr != "" {
		p, url, err := startPage(ctx, l.opts.pageAddr, addr, wcfg.Lock.Prefix, l.stderr)
		if err != nil {
			return err
		}
		defer p.stop()
		if url != "" {
			fmt.Fprintf(l.out, "Lockstep page: %s\n", url)
		}
	}
	defer l.stopRoles(wcfg.Worker.ShutdownTimeout) // after a failed start; a no-op after a clean stop
	if err := l.startRoles(ctx); err != nil {
		return err
	}
	l.header(scfg, addr, !external)

	started := time.Now()
	stopReason, runErr := l.loop(ctx, started)
	fmt.Fprintf(l.out, "stopping (%s): schedulers stop, workers finish their jobs (up to %v)\n",
		stopReason, wcfg.Worker.ShutdownTimeout)
	last := l.collect() // the workers' /metrics close with them
	stopErr := l.stopRoles(wcfg.Worker.ShutdownTimeout)
	res := l.finish(time.Since(started), last)
	if l.hooks.afterStop != nil {
		l.hooks.afterStop(context.WithoutCancel(ctx), l.client, res)
	}
	checkErr := l.check(res, time.Since(started))
	return errors.Join(runErr, stopErr, checkErr)
}

// streamStart is the id from which the demo stream holds this run's records:
// the Redis server's time now.
func streamStart(ctx context.Context, c redis.UniversalClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now, err := c.Time(ctx).Result()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(now.UnixMilli(), 10) + "-0", nil
}

// startRoles starts the scheduler replicas, then the workers, each role
// ready before the next starts.
func (l *localRun) startRoles(ctx context.Context) error {
	port := func(i int) int {
		if l.opts.httpPort == 0 {
			return 0
		}
		return l.opts.httpPort + i
	}
	for i := range l.opts.schedulers {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted while starting: %w", err)
		}
		name, reg := fmt.Sprintf("scheduler-%d", i+1), &registry{}
		r, err := startRole(name, schedulerRun(name, reg), l.opts.schedulerConfig, l.env, l.stderr, port(i), l.http)
		if err != nil {
			return err
		}
		l.replicas = append(l.replicas, r)
		l.schedulers = append(l.schedulers, registrySource(name, reg))
	}
	for i := range l.opts.workers {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted while starting: %w", err)
		}
		w, err := startRole(fmt.Sprintf("worker-%d", i+1), workerRun, l.opts.workerConfig, l.env, l.stderr,
			port(l.opts.schedulers+i), l.http)
		if err != nil {
			return err
		}
		l.workers = append(l.workers, w)
	}
	return nil
}

func (l *localRun) header(scfg *config.SchedulerConfig, addr string, embedded bool) {
	redisKind := "Redis at " + addr
	host, port := addr, ""
	if i := strings.LastIndex(addr, ":"); i >= 0 {
		host, port = addr[:i], addr[i+1:]
	}
	if embedded {
		redisKind = "embedded Redis (miniredis, in memory) at " + addr
	}
	fmt.Fprintf(l.out, "Lockstep local run: %s, %d scheduler replicas, %d workers, %d schedules from %s\n",
		redisKind, len(l.replicas), len(l.workers), len(scfg.Schedules), l.opts.schedulerConfig)
	for _, r := range l.replicas {
		fmt.Fprintf(l.out, "  %-12s %s\n", r.name, r.metricsURL())
	}
	for _, w := range l.workers {
		fmt.Fprintf(l.out, "  %-12s %s\n", w.name, w.metricsURL())
	}
	fmt.Fprintf(l.out, "  %-12s redis-cli -h %s -p %s XRANGE %s - +\n", "executions", host, port, l.execs.stream)
	if endpoint := cmp.Or(l.lookup("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), l.lookup("OTEL_EXPORTER_OTLP_ENDPOINT")); endpoint != "" {
		services := cmp.Or(l.lookup("OTEL_SERVICE_NAME"), "lockstep-scheduler and lockstep-worker")
		fmt.Fprintf(l.out, "  %-12s sent by OTLP to %s: in its UI (Jaeger's: http://localhost:16686) find service %s, operation lockstep.tick\n",
			"traces", endpoint, services)
	}
	until := "Ctrl-C stops"
	if l.opts.duration > 0 {
		until = fmt.Sprintf("stops after %v", l.opts.duration)
	}
	fmt.Fprintf(l.out, "Summary every %v; %s.\n", l.opts.every, until)
}

// loop prints a summary line every opts.every until the duration passes, ctx
// ends or a worker ends on its own (an error).
func (l *localRun) loop(ctx context.Context, started time.Time) (reason string, err error) {
	exited := make(chan *roleProc, len(l.workers)) // buffered: every worker ends eventually
	for _, w := range l.workers {
		go func() { <-w.done; exited <- w }()
	}
	tick := time.NewTicker(l.opts.every)
	defer tick.Stop()
	var deadline <-chan time.Time
	if l.opts.duration > 0 {
		t := time.NewTimer(l.opts.duration)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return "interrupted", nil
		case <-deadline:
			return fmt.Sprintf("ran for %v", l.opts.duration), nil
		case w := <-exited:
			if w.err == nil {
				w.err = errors.New("it returned without being stopped")
			}
			return w.name + " ended", fmt.Errorf("%s ended: %w", w.name, w.err)
		case <-tick.C:
			fmt.Fprintln(l.out, line(time.Since(started), l.collect(), l.execs))
		}
	}
}

// collect reads the roles' metrics and the new demo records.
func (l *localRun) collect() snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var workers []source
	for _, w := range l.workers {
		workers = append(workers, scrapeSource(w, l.http))
	}
	s := collect(ctx, l.schedulers, workers)
	if err := l.execs.read(ctx); err != nil {
		s.errs = append(s.errs, err.Error())
	}
	return s
}

// stopRoles stops the schedulers, then the workers (all at once). It is
// safe to call again.
func (l *localRun) stopRoles(shutdown time.Duration) error {
	var errs []error
	for _, r := range l.replicas {
		errs = append(errs, r.stop(schedulerStopTimeout))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, w := range l.workers {
		wg.Go(func() {
			err := w.stop(shutdown + workerStopSlack)
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		})
	}
	wg.Wait()
	l.replicas, l.workers = nil, nil
	return errors.Join(errs...)
}

// finish prints the last line, once every role stopped: the schedulers'
// final counts, and every execution recorded. last is the snapshot taken
// before the workers stopped.
func (l *localRun) finish(elapsed time.Duration, last snapshot) result {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	final := collect(ctx, l.schedulers, nil)
	final.jobsOK, final.jobsFailed, final.contended = last.jobsOK, last.jobsFailed, last.contended
	final.renewed, final.renewFail, final.lost = last.renewed, last.renewFail, last.lost
	if err := l.execs.read(ctx); err != nil {
		final.errs = append(final.errs, err.Error())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "stopped after %v: ticks %d enqueued (%s), %d missed, %d duplicate | executions recorded: %d ok",
		elapsed.Round(100*time.Millisecond), total(final.enqueued), counts(final.enqueued), final.missed, final.duplicate,
		l.execs.ok())
	for _, o := range []string{demo.OutcomeLockLost, demo.OutcomeFenceRejected, demo.OutcomeCanceled} {
		fmt.Fprintf(&b, ", %d %s", l.execs.outcomes[o], o)
	}
	// Tasks not run yet stay for the next run (a real Redis) or go (embedded).
	if q, err := asynq.NewInspectorFromRedisClient(l.client).GetQueueInfo(demo.Queue); err == nil {
		fmt.Fprintf(&b, " | left in the queue: %d", q.Pending+q.Active+q.Scheduled+q.Retry)
	}
	fmt.Fprintln(l.out, b.String())
	return result{final: final, execs: l.execs}
}

// check says whether the run kept Lockstep's promises, as far as one run can
// see them: no tick enqueued twice, no task run to success twice, no two
// executions of an order at once, fences rising per order. A run of
// minCheckedRun or more must also have enqueued ticks and finished jobs.
func (l *localRun) check(r result, elapsed time.Duration) error {
	problems := slices.Clone(r.execs.violations)
	if r.final.duplicate > 0 {
		problems = append(problems, fmt.Sprintf("%d ticks were claimed twice (the second enqueue met the existing task id)", r.final.duplicate))
	}
	if elapsed >= minCheckedRun {
		if total(r.final.enqueued) == 0 {
			problems = append(problems, "no tick was enqueued")
		}
		if r.execs.ok() == 0 {
			problems = append(problems, "no job finished ok")
		}
	}
	if len(problems) == 0 {
		fmt.Fprintln(l.out, "check ok: every tick enqueued once, no task ran to success twice, "+
			"no two executions of an order (or of a tenant's permit) at once, fences rose per order and per permit")
		return nil
	}
	for _, p := range problems {
		fmt.Fprintln(l.out, "check FAILED:", p)
	}
	return fmt.Errorf("%d checks failed", len(problems))
}

// configError marks err as a configuration error, with a hint when a file is
// missing.
func configError(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w (run it from the repository root, as make run does, or name the files with "+
			"--scheduler-config and --worker-config)", errConfig, err)
	}
	return fmt.Errorf("%w: %w", errConfig, err)
}

// lookup is the run's variable k, "" when unset.
func (l *localRun) lookup(k string) string {
	v, _ := l.env(k)
	return v
}
