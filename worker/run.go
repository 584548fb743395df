package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/role"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// DefaultConfigPath is where Run looks for the configuration when --config is
// not given. When that file does not exist, the defaults and LOCKSTEP_*
// variables alone configure the worker.
const DefaultConfigPath = "configs/worker.yaml"

// ErrConfig is matched (errors.Is) by Run's error when the flags or the
// configuration are invalid. Main exits with status 2 for it.
var ErrConfig = role.ErrConfig

// Main runs a worker with handlers until SIGTERM or SIGINT, then exits: 0
// after a clean shutdown or --help, 2 when the flags or the configuration are
// invalid (after one line on stderr naming the file, field and problem), 1 on
// any other error. It is the whole main function of a worker binary:
//
//	func main() { worker.Main(worker.Handle("order:pay", pay).Lock(orderLock, 30*time.Second)) }
//
// The flags are --config (default configs/worker.yaml) and --http-addr
// (overrides http.addr); every configuration field can also be set with a
// LOCKSTEP_* variable, e.g. LOCKSTEP_REDIS_ADDR. A second signal during the
// shutdown ends the process at once.
func Main(handlers ...Handler) {
	role.Main("worker", func(ctx context.Context, env role.Env) error {
		return Env(env).Run(ctx, handlers...)
	})
}

// Run runs a worker with handlers until ctx ends, then shuts it down: it
// stops taking tasks, lets running handlers finish within
// worker.shutdown_timeout, releases every lock and returns nil. args are the
// command-line flags without the program name (see Main); the configuration
// also reads the process's LOCKSTEP_* variables and the logs go to stderr
// (Env.Run takes those as parameters). The built-in demo:order.pay job is
// registered only when asked: DemoJob among handlers, or worker.demo: true in
// the configuration.
//
// Run returns an error matching ErrConfig when the flags or the
// configuration are invalid, and another error when the worker cannot start
// (a busy HTTP address, a task type registered twice) or stop cleanly.
func Run(ctx context.Context, args []string, handlers ...Handler) error {
	return Env{Args: args}.Run(ctx, handlers...)
}

// Check loads the configuration as Run would from args and validates the
// worker's wiring with handlers without connecting to anything or starting
// it. A test of a worker binary can call it to catch a bad configuration file
// or a task type registered twice before deploying.
func Check(args []string, handlers ...Handler) error {
	return Env{Args: args, Stderr: io.Discard}.Check(handlers...)
}

// Env is what a worker reads from its process, as parameters: Run and Check
// are Env{Args: args}.Run and .Check. A program that runs a worker beside
// other things, or a test, sets the variables and the log output here
// instead of in the process.
type Env struct {
	Args      []string                    // the flags, without the program name
	LookupEnv func(string) (string, bool) // the LOCKSTEP_* variables; nil: os.LookupEnv
	Stderr    io.Writer                   // logs and --help; nil: os.Stderr
}

// Run is Run with e's arguments, variables and log output.
func (e Env) Run(ctx context.Context, handlers ...Handler) error {
	env := role.Env(e)
	cfg, err := loadConfig(env)
	if err != nil {
		return err
	}
	hs, err := checkSpecs(cfg, handlers)
	if err != nil {
		return err
	}
	tp, endTracing, err := tracing.ForRole(ownTracerProvider(handlers), env.Lookup(), "lockstep-worker", env.Errors())
	if err != nil {
		return role.ConfigError(err)
	}
	defer endTracing() // after the app stopped: the last spans are flushed
	log := config.NewLogger(cfg.Log, env.Errors())
	onStarts := fx.Module("onstart", fx.Invoke(func(lc fx.Lifecycle, c redis.UniversalClient) {
		starts(handlers, lc, Runtime{Redis: c, Log: log, Lookup: env.Lookup(), Queues: cfg.Worker.Queues, LockPrefix: cfg.Lock.Prefix})
	}))
	app := fx.New(appOptions(cfg, hs, log, onStarts), fx.Provide(func() trace.TracerProvider { return tp }))
	return role.Run(ctx, app, log, "lockstep worker running", "lock_backend", cfg.Lock.Backend, "redis", cfg.Redis, "http", cfg.HTTP.Addr)
}

// Check is Check with e's arguments and variables; it writes nothing but
// --help's usage.
func (e Env) Check(handlers ...Handler) error {
	cfg, err := loadConfig(role.Env(e))
	if err != nil {
		return err
	}
	hs, err := checkSpecs(cfg, handlers)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	return fx.ValidateApp(appOptions(cfg, hs, log))
}

// checkSpecs converts handlers and checks that, with the demo job when the
// configuration asks for it, their task types are distinct.
func checkSpecs(cfg *config.WorkerConfig, handlers []Handler) ([]jobs.Spec, error) {
	var own []Handler
	for _, h := range handlers {
		if _, ok := h.(demoJob); ok {
			cfg.Worker.Demo = true
			continue
		}
		if _, ok := h.(tracerProvider); ok {
			continue
		}
		if _, ok := h.(onStart); ok {
			continue
		}
		own = append(own, h)
	}
	hs, err := specs(own)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckLinked(); err != nil {
		return nil, role.ConfigError(err)
	}
	if b := cfg.Lock.Backend; b == config.BackendRedlock {
		for _, s := range hs {
			if s.Limit > 1 {
				return nil, role.ConfigError(fmt.Errorf("lock.backend: %s has no permits, and task type %q declares Limit(%d): use lock.backend redis or etcd, or no Limit", b, s.Type, s.Limit))
			}
		}
	}
	all := hs
	if cfg.Worker.Demo {
		all = append(all[:len(all):len(all)], demo.Spec(nil, cfg.Lock.Prefix, ""), demo.RatedSpec(nil, cfg.Lock.Prefix, ""))
		if demoTenants(cfg) {
			all = append(all, demo.TenantSpec(nil, cfg.Lock.Prefix, ""))
		}
	}
	if _, err := jobs.NewRegistry(all); err != nil {
		return nil, err
	}
	return hs, nil
}

// loadConfig parses the flags and loads the configuration they name.
func loadConfig(env role.Env) (*config.WorkerConfig, error) {
	f, err := role.Parse("worker", DefaultConfigPath, true, env)
	if err != nil {
		return nil, err
	}
	cfg, err := config.LoadWorker(f.Config, env.Lookup())
	if err != nil {
		return nil, role.ConfigError(err)
	}
	if f.HTTPAddr != "" {
		cfg.HTTP.Addr = f.HTTPAddr
	}
	return cfg, nil
}

// starts appends the OnStart functions among handlers to lc, in order: the
// jobs server, appended later, starts after them.
func starts(handlers []Handler, lc fx.Lifecycle, rt Runtime) {
	for _, h := range handlers {
		if o, ok := h.(onStart); ok && o.f != nil {
			lc.Append(fx.StartHook(func(ctx context.Context) error { return o.f(ctx, rt) }))
		}
	}
}

// ownTracerProvider is the provider passed among handlers
// (WithTracerProvider), or nil.
func ownTracerProvider(handlers []Handler) trace.TracerProvider {
	for _, h := range handlers {
		if t, ok := h.(tracerProvider); ok && t.tp != nil {
			return t.tp
		}
	}
	return nil
}
