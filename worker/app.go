package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/metrics/asynqmetrics"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/role"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// stopSlack is how much longer than the shutdown timeout the whole stop may
// take (closing the HTTP server and the Redis client) before fx gives up.
const stopSlack = 10 * time.Second

// appOptions assembles the worker role: Redis, metrics, locks, the watchdog,
// the handlers and the HTTP endpoints. It is what Run starts and Check
// validates. before (OnStart's hooks) starts before the jobs server.
func appOptions(cfg *config.WorkerConfig, handlers []jobs.Spec, log *slog.Logger, before ...fx.Option) fx.Option {
	groupSpecs := make([]any, 0, len(handlers))
	for _, s := range handlers {
		groupSpecs = append(groupSpecs, fx.Annotated{Group: jobs.Group, Target: s})
	}
	opts := []fx.Option{
		role.FxLogger(log),
		fx.StopTimeout(cfg.Worker.ShutdownTimeout + stopSlack),
		fx.Supply(cfg, log),
		fx.Supply(groupSpecs...),
		fx.Provide(
			newRedisClient,
			newMetrics,
			newLocker,
			newWatchdog,
			jobsConfig,
		),
		// The HTTP module comes first so that its server starts before the
		// jobs server and stops after it: /metrics and /readyz answer while
		// handlers drain.
		fx.Module("http", fx.Invoke(startHTTP)),
		fx.Options(before...),
		jobs.Module,
	}
	if cfg.Worker.Demo {
		opts = append(opts, fx.Provide(newDemoStore), fx.Provide(fx.Annotate(demoSpec, fx.ResultTags(`group:"`+jobs.Group+`"`))),
			fx.Provide(fx.Annotate(demoRatedSpec, fx.ResultTags(`group:"`+jobs.Group+`"`))))
		if demoTenants(cfg) {
			opts = append(opts, fx.Provide(fx.Annotate(demoTenantSpec, fx.ResultTags(`group:"`+jobs.Group+`"`))))
		}
	}
	return fx.Options(opts...)
}

// newRedisClient builds the one client that asynq, the locks, the watchdog
// and the handlers share.
func newRedisClient(lc fx.Lifecycle, cfg *config.WorkerConfig) (redis.UniversalClient, error) {
	r := cfg.Redis
	if r.PoolSize == 0 {
		// Every handler may hold a connection while asynq's loops hold theirs.
		r.PoolSize = max(10*runtime.GOMAXPROCS(0), cfg.Worker.Concurrency+10)
	}
	// Context deadlines (a renewal round's, a release's) bound its calls.
	c, err := r.NewClient()
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StartStopHook(role.WaitForRedis(c, cfg.Redis.String()), c.Close))
	return c, nil
}

func newMetrics(c redis.UniversalClient, log *slog.Logger) (*metrics.Metrics, prometheus.Gatherer) {
	reg := metrics.NewRegistry()
	reg.MustRegister(asynqmetrics.NewQueueCollector(asynq.NewInspectorFromRedisClient(c), log))
	return metrics.New(reg), reg
}

// newLocker builds the Locker the lock section describes (the redis
// deployment, Redlock on lock.nodes, or etcd). At start it claims the key
// prefix for its back end on the worker's Redis (Locker.ClaimPrefix), and
// renews the claim while it runs: a worker of another back end on the same
// prefix is a configuration error (exit 2), as is this one beside it.
func newLocker(lc fx.Lifecycle, cfg *config.WorkerConfig, c redis.UniversalClient, m *metrics.Metrics, log *slog.Logger) (*lock.Locker, error) {
	l, closeNodes, err := cfg.NewLocker(c, lock.WithMetrics(m))
	if err != nil {
		return nil, err
	}
	stop, done := make(chan struct{}), make(chan struct{})
	lc.Append(fx.StartStopHook(func(ctx context.Context) error {
		if err := l.ClaimPrefix(ctx, c); err != nil {
			close(done)
			if _, ok := errors.AsType[*lock.BackendConflictError](err); ok {
				return role.ConfigError(err)
			}
			return err
		}
		go func() {
			defer close(done)
			t := time.NewTicker(lock.PrefixClaimTTL / 3)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					ctx, cancel := context.WithTimeout(context.Background(), lock.PrefixClaimTTL/3)
					if err := l.ClaimPrefix(ctx, c); err != nil {
						log.Error("the claim of the key prefix by this back end was not renewed", "backend", l.BackendName(), "err", err)
					}
					cancel()
				}
			}
		}()
		return nil
	}, func() error {
		close(stop)
		<-done
		return closeNodes()
	}))
	return l, nil
}

func newWatchdog(lc fx.Lifecycle, cfg *config.WorkerConfig, c redis.UniversalClient, l *lock.Locker, m *metrics.Metrics, log *slog.Logger) *watchdog.Watchdog {
	opts := watchdog.Options{
		Interval:    cfg.Lock.RenewInterval,
		DriftMargin: cfg.Lock.DriftMargin,
		Metrics:     m,
		Logger:      log,
	}
	if l.SharesClient() {
		// Redlock's nodes are renewed on a quorum; a notice from one node
		// proves nothing, so Redlock relies on renewals. etcd's back end
		// watches its keys itself (Locker.NotifyLoss).
		opts.Notifier = watchdog.Tracking(c, l.KeyPrefix(), log)
	}
	w := watchdog.New(opts)
	lc.Append(fx.StartStopHook(w.Start, w.Stop))
	return w
}

func jobsConfig(cfg *config.WorkerConfig) jobs.Config {
	w := cfg.Worker
	return jobs.Config{
		Queues:          w.Queues,
		StrictPriority:  w.StrictPriority,
		Concurrency:     w.Concurrency,
		ShutdownTimeout: w.ShutdownTimeout,
		LockTTL:         cfg.Lock.TTL,
		Backoff:         backoff.Jitter{Min: w.ContentionBackoffMin, Max: w.ContentionBackoffMax},
		PollInterval:    w.PollInterval,
	}
}

func demoSpec(cfg *config.WorkerConfig, c redis.UniversalClient, pg *demo.Postgres) jobs.Spec {
	return demo.Spec(c, cfg.Lock.Prefix, procid.Self(), demoOptions(pg)...)
}

func demoTenantSpec(cfg *config.WorkerConfig, c redis.UniversalClient, pg *demo.Postgres) jobs.Spec {
	return demo.TenantSpec(c, cfg.Lock.Prefix, procid.Self(), demoOptions(pg)...)
}

// demoRatedSpec is demo:api.call, rate limited per client; its rate lives
// in the queue's Redis whatever the lock back end.
func demoRatedSpec(cfg *config.WorkerConfig, c redis.UniversalClient) jobs.Spec {
	return demo.RatedSpec(c, cfg.Lock.Prefix, procid.Self())
}

func demoOptions(pg *demo.Postgres) []demo.Option {
	if pg == nil {
		return nil
	}
	return []demo.Option{demo.WithPostgres(pg)}
}

// newDemoStore is the demo jobs' PostgreSQL store with demo.store postgres
// (nil with redis): its tables are created at start, which fails, naming
// the store, when PostgreSQL does not answer within the start's deadline.
// Its fences are named after the lock back end (fence.Table.LockName).
func newDemoStore(lc fx.Lifecycle, cfg *config.WorkerConfig) (*demo.Postgres, error) {
	if cfg.Demo.Store != config.DemoPostgres {
		return nil, nil
	}
	// It only fails for a driver not linked, which CheckLinked refused;
	// the DSN is parsed at the first connection.
	db, err := sql.Open(config.PostgresDriver, string(cfg.Demo.PostgresDSN))
	if err != nil {
		return nil, err
	}
	// Every handler may hold a connection; more would only queue in
	// PostgreSQL.
	db.SetMaxOpenConns(cfg.Worker.Concurrency * 2)
	db.SetMaxIdleConns(cfg.Worker.Concurrency)
	pg := demo.NewPostgres(db, string(cfg.Lock.Backend))
	lc.Append(fx.StartStopHook(func(ctx context.Context) error {
		var delay time.Duration
		for {
			err := pg.Create(ctx)
			if err == nil {
				return nil
			}
			delay = backoff.Reconnect.Next(delay)
			if d, ok := ctx.Deadline(); ctx.Err() != nil || ok && time.Until(d) < delay {
				return fmt.Errorf("demo.store postgres (demo.postgres_dsn) does not answer: %w", err)
			}
			backoff.Sleep(ctx, delay)
		}
	}, db.Close))
	return pg, nil
}

// demoTenants reports whether the demo's demo:tenant.sync (limit 3) runs:
// on the back ends with permits, redis and etcd.
func demoTenants(cfg *config.WorkerConfig) bool {
	return cfg.Lock.Backend != config.BackendRedlock
}

type httpIn struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    *config.WorkerConfig
	Gatherer  prometheus.Gatherer
	Client    redis.UniversalClient
	Jobs      *jobs.Server
	Locker    *lock.Locker
	Log       *slog.Logger
}

// startHTTP serves /metrics, /healthz and /readyz (Redis reachable, the
// worker taking tasks).
func startHTTP(in httpIn) {
	srv := metrics.NewServer(in.Config.HTTP.Addr, in.Gatherer, map[string]func(context.Context) error{
		"redis": func(ctx context.Context) error {
			if err := in.Client.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("ping %s: %w", in.Config.Redis.Addr, err)
			}
			return nil
		},
		"worker": in.Jobs.Ready,
		"locks": func(ctx context.Context) error { // etcd, when the locks live there
			if err := in.Locker.Ping(ctx); err != nil {
				return fmt.Errorf("lock back end %s: %w", in.Locker.Backend(), err)
			}
			return nil
		},
	}, in.Log)
	in.Lifecycle.Append(fx.StartStopHook(srv.Start, srv.Stop))
}
