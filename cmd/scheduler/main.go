// Command scheduler runs one replica of Lockstep's scheduler: every schedule
// of its configuration, each tick enqueued into asynq exactly once across all
// replicas (see internal/scheduler).
//
//	scheduler [--config configs/scheduler.yaml] [--http-addr :9091]
//
// Every configuration field can be overridden by a LOCKSTEP_* environment
// variable (see internal/config); --http-addr overrides http.addr. It serves
// /metrics, /healthz and /readyz (Redis answers PING and the scheduler runs).
//
// Exit codes: 0 after SIGTERM or SIGINT and a clean stop; 2 for a bad
// configuration or flag, with one line on stderr naming the file (or
// variable), the field and the value; 1 when starting or stopping fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

const (
	startTimeout = 15 * time.Second
	// stopTimeout leaves ticks in flight time to finish (one tick_lock_ttl by
	// default) before the process exits.
	stopTimeout = 30 * time.Second
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stderr))
}

func run(args []string, env func(string) (string, bool), stderr io.Writer) int {
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "configs/scheduler.yaml", "configuration file (YAML)")
	httpAddr := fs.String("http-addr", "", "address for /metrics, /healthz and /readyz; overrides http.addr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, err := load(*path, *httpAddr, env)
	if err != nil {
		fmt.Fprintln(stderr, oneLine(err))
		return 2
	}

	log := config.NewLogger(cfg.Log, stderr)
	app := fx.New(options(cfg, log)...)
	if err := app.Err(); err != nil {
		log.Error("cannot assemble the scheduler", "err", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := app.Start(ctx); err != nil {
		log.Error("start failed", "err", err)
		return 1
	}
	sig := <-app.Wait()
	log.Info("stopping", "signal", sig.Signal)
	ctx, cancel = context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := app.Stop(ctx); err != nil {
		log.Error("stop failed", "err", err)
		return 1
	}
	return sig.ExitCode
}

// load reads the configuration, applies --http-addr and checks the
// schedules' cron expressions, so that every configuration error is found
// before anything starts.
func load(path, httpAddr string, env func(string) (string, bool)) (*config.SchedulerConfig, error) {
	cfg, err := config.LoadScheduler(path, env)
	if err != nil {
		return nil, err
	}
	if httpAddr != "" {
		if _, port, err := net.SplitHostPort(httpAddr); err != nil {
			return nil, &config.Error{Field: "flag --http-addr", Msg: fmt.Sprintf("invalid address %q", httpAddr)}
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, &config.Error{Field: "flag --http-addr", Msg: fmt.Sprintf("invalid port in %q", httpAddr)}
		}
		cfg.HTTP.Addr = httpAddr
	}
	if err := scheduler.Validate(cfg); err != nil {
		for _, e := range flatten(err) {
			if ce, ok := errors.AsType[*config.Error](e); ok && ce.File == "" && ce.Env == "" {
				locate(ce, path, env)
			}
		}
		return nil, err
	}
	return cfg, nil
}

// locate says where the value of a problem the scheduler package found came
// from: its LOCKSTEP_* variable when that is set (the whole schedule list is
// one variable), else the file.
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

// oneLine is the first problem, and how many more there are.
func oneLine(err error) string {
	errs := flatten(err)
	line := errs[0].Error()
	if n := len(errs) - 1; n == 1 {
		line += " (and 1 more problem)"
	} else if n > 1 {
		line += fmt.Sprintf(" (and %d more problems)", n)
	}
	return line
}

// options assemble the scheduler role.
func options(cfg *config.SchedulerConfig, log *slog.Logger) []fx.Option {
	return []fx.Option{
		fx.WithLogger(func() fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log}
			l.UseLogLevel(slog.LevelDebug)
			return l
		}),
		fx.Supply(cfg, log),
		fx.Provide(newRedis, newMetrics, newServer),
		scheduler.Module,
		fx.Invoke(func(*metrics.Server) {}),
	}
}

func newRedis(lc fx.Lifecycle, cfg *config.SchedulerConfig) (redis.UniversalClient, error) {
	opts, err := cfg.Redis.UniversalOptions()
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true // a tick's deadline bounds its Redis calls
	c := redis.NewUniversalClient(opts)
	lc.Append(fx.StopHook(c.Close))
	return c, nil
}

func newMetrics() (*prometheus.Registry, *metrics.Metrics) {
	reg := metrics.NewRegistry()
	return reg, metrics.New(reg)
}

func newServer(lc fx.Lifecycle, cfg *config.SchedulerConfig, reg *prometheus.Registry, c redis.UniversalClient,
	s *scheduler.Scheduler, log *slog.Logger) *metrics.Server {
	srv := metrics.NewServer(cfg.HTTP.Addr, reg, map[string]func(context.Context) error{
		"redis":     func(ctx context.Context) error { return c.Ping(ctx).Err() },
		"scheduler": s.Ready,
	}, log)
	lc.Append(fx.StartStopHook(srv.Start, srv.Stop))
	return srv
}
