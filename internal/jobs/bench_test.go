package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
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
	counter *commandCounter
	enq     *asynq.Client
	metrics *metrics.Metrics
}

func newBenchRig(b *testing.B) *benchRig {
	rs := redistest.Start(b)
	r := &benchRig{
		client:  rs.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }),
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
	wd := watchdog.New(watchdog.Options{Metrics: r.metrics})
	srv := NewServer(Params{
		Client: r.client, Locker: lock.New(r.client, lock.WithMetrics(r.metrics)), Watchdog: wd,
		Registry: reg, Metrics: r.metrics, Config: cfg,
	})
	if err := srv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return func() {
		_ = srv.Stop(context.Background())
		_ = wd.Stop(context.Background())
	}
}

// servePlain runs h on a plain asynq server with the same polling as ours.
func (r *benchRig) servePlain(b *testing.B, cfg Config, h asynq.HandlerFunc) (stop func()) {
	poll := min(max(cfg.Backoff.Min, 20*time.Millisecond), time.Second)
	srv := asynq.NewServerFromRedisClient(r.client, asynq.Config{
		Concurrency:              cfg.Concurrency,
		TaskCheckInterval:        poll,
		DelayedTaskCheckInterval: poll,
		LogLevel:                 asynq.ErrorLevel,
		ShutdownTimeout:          time.Second,
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

// BenchmarkThroughput compares no-op jobs through the lock middleware (each
// on its own resource: acquire, watchdog hold, release) with the same jobs
// on a plain asynq server, on the same kind of Redis, in one run.
func BenchmarkThroughput(b *testing.B) {
	cfg := Config{Concurrency: 10, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
	for _, mode := range []string{"asynq", "locked"} {
		b.Run(mode, func(b *testing.B) {
			r := newBenchRig(b)
			r.enqueue(b, "bench:noop", b.N, func(i int) string { return fmt.Sprintf("res-%d", i) })
			c := newCounter(b.N)
			r.counter.n.Store(0)
			b.ResetTimer()
			var stop func()
			if mode == "asynq" {
				stop = r.servePlain(b, cfg, func(context.Context, *asynq.Task) error { c.add(); return nil })
			} else {
				stop = r.serveLocked(b, cfg, Spec{
					Type:     "bench:noop",
					Decode:   func(p []byte) (any, error) { return string(p), nil },
					Resource: func(p any) string { return p.(string) },
					Run:      func(context.Context, Job, any) error { c.add(); return nil },
				})
			}
			waitDone(b, c.done, 5*time.Minute)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
			b.ReportMetric(float64(r.counter.n.Load())/float64(b.N), "redis-cmds/job")
			stop()
		})
	}
}

// BenchmarkContention runs 200 jobs on one order with 8 handlers at once,
// each job working 5ms under the lock: through the middleware, where a busy
// lock requeues the job (woken by the next release, backoff as the
// fallback), with the default poll interval (100ms, from the backoff's
// minimum) and with 10ms; and on a plain asynq server whose handler spins on
// the lock, retrying every 50-100ms and holding its worker slot meanwhile.
// It reports lock attempts and Redis commands (all of them, asynq's polling
// included) per completed job, and the wall time of the 200 jobs.
func BenchmarkContention(b *testing.B) {
	const jobsN, work = 200, 5 * time.Millisecond
	for _, mode := range []string{"requeue", "requeue-poll10ms", "spin"} {
		b.Run(mode, func(b *testing.B) {
			cfg := Config{Concurrency: 8, Backoff: backoff.Requeue, LockTTL: 30 * time.Second}
			if mode == "requeue-poll10ms" {
				// A woken task waits for asynq's one dequeue loop, which
				// sleeps PollInterval/2..1.5×PollInterval on an empty queue.
				cfg.PollInterval = 10 * time.Millisecond
			}
			r := newBenchRig(b)
			locker := lock.New(r.client, lock.WithMetrics(r.metrics))
			var elapsed time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				resource := fmt.Sprintf("lock:order:%d", i)
				r.enqueue(b, "bench:pay", jobsN, func(int) string { return resource })
				c := newCounter(jobsN)
				b.StartTimer()
				begin := time.Now()
				var stop func()
				if mode != "spin" {
					stop = r.serveLocked(b, cfg, Spec{
						Type:     "bench:pay",
						Decode:   func(p []byte) (any, error) { return string(p), nil },
						Resource: func(p any) string { return p.(string) },
						Run: func(ctx context.Context, _ Job, _ any) error {
							time.Sleep(work)
							c.add()
							return nil
						},
					})
				} else {
					stop = r.servePlain(b, cfg, func(ctx context.Context, t *asynq.Task) error {
						lease, err := spinAcquire(ctx, locker, string(t.Payload()))
						if err != nil {
							return err
						}
						time.Sleep(work)
						c.add()
						return lease.Release(ctx)
					})
				}
				waitDone(b, c.done, 5*time.Minute)
				elapsed += time.Since(begin)
				b.StopTimer()
				stop()
			}
			jobs := float64(b.N * jobsN)
			attempts := testutil.ToFloat64(r.metrics.LockAcquire.WithLabelValues(metrics.AcquireAcquired)) +
				testutil.ToFloat64(r.metrics.LockAcquire.WithLabelValues(metrics.AcquireBusy))
			b.ReportMetric(attempts/jobs, "lock-attempts/job")
			b.ReportMetric(float64(r.counter.n.Load())/jobs, "redis-cmds/job")
			b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/200jobs")
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
