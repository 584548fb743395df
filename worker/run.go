package worker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
)

// DefaultConfigPath is where Run looks for the configuration when --config is
// not given. When that file does not exist, the defaults and LOCKSTEP_*
// variables alone configure the worker.
const DefaultConfigPath = "configs/worker.yaml"

// ErrConfig is matched (errors.Is) by Run's error when the flags or the
// configuration are invalid. Main exits with status 2 for it.
var ErrConfig = errors.New("invalid configuration")

// errHelp ends Run after --help printed the usage.
var errHelp = errors.New("help requested")

// Main runs a worker with handlers until SIGTERM or SIGINT, then exits: 0
// after a clean shutdown, 2 when the flags or the configuration are invalid
// (after one line on stderr naming the file, field and problem), 1 on any
// other error. It is the whole main function of a worker binary:
//
//	func main() { worker.Main(worker.Handle("order:pay", pay).Lock(orderLock, 30*time.Second)) }
//
// The flags are --config (default configs/worker.yaml) and --http-addr
// (overrides http.addr); every configuration field can also be set with a
// LOCKSTEP_* variable, e.g. LOCKSTEP_REDIS_ADDR. A second signal during the
// shutdown ends the process at once.
func Main(handlers ...Handler) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop() // the next signal takes the default action: exit now
	}()
	err := Run(ctx, os.Args[1:], handlers...)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, ErrConfig):
		fmt.Fprintln(stderr, err)
		return 2
	}
	fmt.Fprintln(stderr, "worker:", oneLine(err.Error()))
	return 1
}

// Run runs a worker with handlers until ctx ends, then shuts it down: it
// stops taking tasks, lets running handlers finish within
// worker.shutdown_timeout, releases every lock and returns nil. args are the
// command-line flags without the program name (see Main). The built-in
// demo:order.pay job is registered only when asked: DemoJob among handlers,
// or worker.demo: true in the configuration.
//
// Run returns an error matching ErrConfig when the flags or the
// configuration are invalid, and another error when the worker cannot start
// (a busy HTTP address, a task type registered twice) or stop cleanly.
func Run(ctx context.Context, args []string, handlers ...Handler) error {
	cfg, err := loadConfig(args, os.Stderr)
	if err != nil {
		return err
	}
	hs, err := checkSpecs(cfg, handlers)
	if err != nil {
		return err
	}
	log := config.NewLogger(cfg.Log, os.Stderr)
	app := fx.New(appOptions(cfg, hs, log))
	if err := app.Err(); err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, app.StartTimeout())
	err = app.Start(startCtx)
	cancel()
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), app.StopTimeout())
		defer cancel()
		return errors.Join(err, app.Stop(stopCtx))
	}
	log.Info("lockstep worker running", "redis", cfg.Redis, "http", cfg.HTTP.Addr)
	<-ctx.Done()
	log.Info("shutting down", "cause", context.Cause(ctx))
	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), app.StopTimeout())
	defer stopCancel()
	return app.Stop(stopCtx)
}

// Check loads the configuration as Run would from args and validates the
// worker's wiring with handlers without connecting to anything or starting
// it. A test of a worker binary can call it to catch a bad configuration file
// or a task type registered twice before deploying.
func Check(args []string, handlers ...Handler) error {
	cfg, err := loadConfig(args, io.Discard)
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
		own = append(own, h)
	}
	hs, err := specs(own)
	if err != nil {
		return nil, err
	}
	all := hs
	if cfg.Worker.Demo {
		all = append(all[:len(all):len(all)], demo.Spec(nil, cfg.Lock.Prefix, ""))
	}
	if _, err := jobs.NewRegistry(all); err != nil {
		return nil, err
	}
	return hs, nil
}

// configError is a configuration problem shown as one line: the first
// problem, and how many more there are.
type configError struct {
	err error
}

func (e *configError) Error() string {
	lines := strings.Split(strings.TrimSpace(e.err.Error()), "\n")
	if len(lines) > 1 {
		return fmt.Sprintf("%s (and %d more problems)", lines[0], len(lines)-1)
	}
	return lines[0]
}

func (e *configError) Unwrap() []error { return []error{ErrConfig, e.err} }

// loadConfig parses the flags and loads the configuration they name.
func loadConfig(args []string, usage io.Writer) (*config.WorkerConfig, error) {
	flags := flag.NewFlagSet("worker", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	path := flags.String("config", DefaultConfigPath, "configuration file (YAML); LOCKSTEP_* variables override it")
	httpAddr := flags.String("http-addr", "", "address of /metrics, /healthz and /readyz (overrides http.addr)")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			flags.SetOutput(usage)
			fmt.Fprintln(usage, "Usage: worker [--config FILE] [--http-addr HOST:PORT]")
			flags.PrintDefaults()
			return nil, errHelp
		}
		return nil, &configError{err}
	}
	if flags.NArg() > 0 {
		return nil, &configError{fmt.Errorf("unexpected argument %q", flags.Arg(0))}
	}
	explicit := false
	flags.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	file := *path
	if !explicit {
		if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
			file = ""
		}
	}
	cfg, err := config.LoadWorker(file, os.LookupEnv)
	if err != nil {
		return nil, &configError{err}
	}
	if *httpAddr != "" {
		if _, _, err := net.SplitHostPort(*httpAddr); err != nil {
			return nil, &configError{fmt.Errorf("flag --http-addr: invalid address %q: %v", *httpAddr, err)}
		}
		cfg.HTTP.Addr = *httpAddr
	}
	return cfg, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
