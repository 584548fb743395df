package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/role"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// DefaultConfigPath is the configuration file Run reads when --config is not
// given.
const DefaultConfigPath = "configs/scheduler.yaml"

// stopTimeout leaves ticks in flight time to finish (one tick_lock_ttl by
// default) before the process exits.
const stopTimeout = 30 * time.Second

// Run runs one scheduler replica, the scheduler role, until ctx ends, then
// stops it (ticks in flight finish) within its stop timeout: env's flags
// (--config, --http-addr) and LOCKSTEP_* variables configure it (see
// internal/role), its logs go to env's stderr. It serves /metrics, /healthz
// and /readyz (Redis answers PING and the scheduler runs). extra options join
// the app (cmd/local names each replica's logs and reads its registry).
//
// The standard OTEL_* variables configure its tracing (internal/tracing
// FromEnv); with none set it traces nothing.
//
// A bad flag or configuration is an error matching role.ErrConfig, found
// before anything starts; --help returns role.ErrHelp.
func Run(ctx context.Context, env role.Env, extra ...fx.Option) error {
	f, err := role.Parse("scheduler", DefaultConfigPath, false, env)
	if err != nil {
		return err
	}
	cfg, err := Load(f.Config, f.HTTPAddr, env.Lookup())
	if err != nil {
		return role.ConfigError(err)
	}
	tp, endTracing, err := tracing.ForRole(nil, env.Lookup(), "lockstep-scheduler", env.Errors())
	if err != nil {
		return role.ConfigError(err)
	}
	defer endTracing() // after the app stopped: the last spans are flushed
	log := config.NewLogger(cfg.Log, env.Errors())
	app := fx.New(AppOptions(cfg, log), fx.Provide(func() trace.TracerProvider { return tp }), fx.Options(extra...))
	// The scheduler's own locks (tick claims, schedules' run locks) are on
	// Redis whatever lock.backend says; the log names it as the workers do.
	return role.Run(ctx, app, log, "lockstep scheduler running", "lock_backend", cfg.Lock.Backend,
		"redis", cfg.Redis, "http", cfg.HTTP.Addr, "schedules", len(cfg.Schedules))
}

// Load reads the configuration at path with env's LOCKSTEP_* variables,
// applies httpAddr (the --http-addr flag, "" for none) and checks the
// schedules, so that every configuration error is found before anything
// starts. Problems name the file or variable their value came from.
func Load(path, httpAddr string, env func(string) (string, bool)) (*config.SchedulerConfig, error) {
	cfg, err := config.LoadScheduler(path, env)
	if err != nil {
		return nil, err
	}
	if httpAddr != "" {
		cfg.HTTP.Addr = httpAddr
	}
	if err := Validate(cfg); err != nil {
		for _, e := range flatten(err) {
			if ce, ok := errors.AsType[*config.Error](e); ok && ce.File == "" && ce.Env == "" {
				locate(ce, path, env)
			}
		}
		return nil, err
	}
	return cfg, nil
}

// locate says where the value of a problem Validate found came from: its
// LOCKSTEP_* variable when that is set (the whole schedule list is one
// variable), else the file.
func locate(e *config.Error, path string, env func(string) (string, bool)) {
	name := "LOCKSTEP_SCHEDULES"
	if !strings.HasPrefix(e.Field, "schedules[") {
		name = "LOCKSTEP_" + strings.ToUpper(strings.ReplaceAll(e.Field, ".", "_"))
	}
	if _, ok := env(name); ok {
		e.Env = name
	} else {
		e.File = path
	}
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// AppOptions assemble the scheduler role on cfg: the Redis client, the
// metrics registry, the Scheduler (Module) and the HTTP server. It is what
// Run starts; a test validates it with fx.ValidateApp.
func AppOptions(cfg *config.SchedulerConfig, log *slog.Logger) fx.Option {
	return fx.Options(
		role.FxLogger(log),
		fx.StopTimeout(stopTimeout),
		fx.Supply(cfg, log),
		fx.Provide(newRedis, newRegistry, newServer),
		Module,
		fx.Invoke(func(*metrics.Server) {}),
	)
}

func newRedis(lc fx.Lifecycle, cfg *config.SchedulerConfig) (redis.UniversalClient, error) {
	c, err := cfg.Redis.NewClient() // a tick's deadline bounds its Redis calls
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StartStopHook(role.WaitForRedis(c, cfg.Redis.String()), c.Close))
	return c, nil
}

func newRegistry() (*prometheus.Registry, *metrics.Metrics) {
	reg := metrics.NewRegistry()
	return reg, metrics.New(reg)
}

func newServer(lc fx.Lifecycle, cfg *config.SchedulerConfig, reg *prometheus.Registry, c redis.UniversalClient,
	s *Scheduler, log *slog.Logger) *metrics.Server {
	srv := metrics.NewServer(cfg.HTTP.Addr, reg, map[string]func(context.Context) error{
		"redis":     func(ctx context.Context) error { return c.Ping(ctx).Err() },
		"scheduler": s.Ready,
	}, log)
	lc.Append(fx.StartStopHook(srv.Start, srv.Stop))
	return srv
}
