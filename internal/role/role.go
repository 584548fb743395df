// Package role is the one way a Lockstep process role (a scheduler replica,
// a worker) is assembled and run: the same flags (--config, --http-addr),
// the environment and the output passed in as an Env (nothing reads the
// process's own deep inside), the same start and shutdown, and the same exit
// codes. internal/scheduler (Run) and the public worker package (Run, Env)
// build on it; cmd/scheduler, cmd/worker and cmd/local only call those.
//
// Shutdown: when the run's context ends (Main ends it on the first SIGTERM
// or SIGINT) the role stops within its fx stop timeout, which each role sets
// from its configuration; a second signal ends the process at once.
//
// Exit codes (ExitCode): 0 after a clean stop or --help; 2 for a bad flag or
// configuration, after one line on stderr naming the file (or variable), the
// field and the value; 1 for any other error, after one line.
package role

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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/config"
)

// Env is what a role reads from its process: the command-line arguments
// (without the program name), the LOCKSTEP_* variables and where its logs
// and usage go. The zero value of a field means the process's own.
type Env struct {
	Args      []string
	LookupEnv func(string) (string, bool) // nil: os.LookupEnv
	Stderr    io.Writer                   // nil: os.Stderr
}

// Lookup is e.LookupEnv, or os.LookupEnv when that is nil.
func (e Env) Lookup() func(string) (string, bool) {
	if e.LookupEnv == nil {
		return os.LookupEnv
	}
	return e.LookupEnv
}

// Errors is e.Stderr, or os.Stderr when that is nil.
func (e Env) Errors() io.Writer {
	if e.Stderr == nil {
		return os.Stderr
	}
	return e.Stderr
}

// ErrConfig is matched (errors.Is) by the error of a bad flag or
// configuration: exit status 2.
var ErrConfig = errors.New("invalid configuration")

// ErrHelp ends a run after --help printed the usage: exit status 0.
var ErrHelp = errors.New("help requested")

// ConfigError marks err as a flag or configuration problem (it matches
// ErrConfig and err); its message is config.OneLine(err).
func ConfigError(err error) error { return &configError{err} }

type configError struct{ err error }

func (e *configError) Error() string   { return config.OneLine(e.err) }
func (e *configError) Unwrap() []error { return []error{ErrConfig, e.err} }

// Flags are a role's command-line flags.
type Flags struct {
	Config   string // the configuration file; "" for none (see Parse)
	HTTPAddr string // --http-addr, "" when not given
}

// Parse parses e.Args as role name's flags: --config (default defaultConfig)
// and --http-addr. With optional, a default file that does not exist means
// no file (the defaults and LOCKSTEP_* variables alone); a --config given is
// always read. --help prints the usage on e.Errors() and returns ErrHelp;
// other problems are ConfigErrors.
func Parse(name, defaultConfig string, optional bool, e Env) (Flags, error) {
	var f Flags
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	fl.StringVar(&f.Config, "config", defaultConfig, "configuration file (YAML); LOCKSTEP_* variables override it")
	fl.StringVar(&f.HTTPAddr, "http-addr", "", "address of /metrics, /healthz and /readyz (overrides http.addr)")
	if err := fl.Parse(e.Args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			out := e.Errors()
			fl.SetOutput(out)
			fmt.Fprintf(out, "Usage: %s [--config FILE] [--http-addr HOST:PORT]\n", name)
			fl.PrintDefaults()
			return f, ErrHelp
		}
		return f, ConfigError(err)
	}
	if fl.NArg() > 0 {
		return f, ConfigError(fmt.Errorf("unexpected argument %q", fl.Arg(0)))
	}
	if e.LookupEnv == nil { // the process's variables, which can be listed
		if err := config.CheckEnv(os.Environ()); err != nil {
			return f, ConfigError(err)
		}
	}
	explicit := false
	fl.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "config" })
	if optional && !explicit {
		if _, err := os.Stat(f.Config); errors.Is(err, fs.ErrNotExist) {
			f.Config = ""
		}
	}
	if f.HTTPAddr != "" {
		if err := checkAddr(f.HTTPAddr); err != nil {
			return f, ConfigError(err)
		}
	}
	return f, nil
}

func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return &config.Error{Field: "flag --http-addr", Msg: fmt.Sprintf("invalid address %q", addr)}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return &config.Error{Field: "flag --http-addr", Msg: fmt.Sprintf("invalid port in %q", addr)}
	}
	return nil
}

// FxLogger sends fx's own events to log, at debug level: wiring details
// only when debugging.
func FxLogger(log *slog.Logger) fx.Option {
	return fx.WithLogger(func() fxevent.Logger {
		l := &fxevent.SlogLogger{Logger: log.With("component", "fx")}
		l.UseLogLevel(slog.LevelDebug)
		return l
	})
}

// Run starts app, logs running (with attrs) and runs until ctx ends, then
// stops app within its stop timeout. A start that fails is undone.
func Run(ctx context.Context, app *fx.App, log *slog.Logger, running string, attrs ...any) error {
	if wholeProcess.Load() {
		// go-redis logs (a dial that failed, a Sentinel switch) through one
		// logger per process: in a process of its own, a role's lines are
		// all its JSON.
		redis.SetLogger(redisLog{log})
	}
	if err := app.Err(); err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, app.StartTimeout())
	err := app.Start(startCtx)
	cancel()
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), app.StopTimeout())
		defer cancel()
		return errors.Join(err, app.Stop(stopCtx))
	}
	log.Info(running, attrs...)
	<-ctx.Done()
	log.Info("shutting down", "cause", context.Cause(ctx))
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), app.StopTimeout())
	defer cancel()
	return app.Stop(stopCtx)
}

// WaitForRedis is the start hook of a role's Redis client: it waits for
// Redis to answer PING, retrying with the reconnect backoff, until the
// start's deadline (fx's start timeout, 15s). A role whose Redis does not
// answer by then fails to start, naming addr: the worker and the scheduler
// alike exit 1, and a supervisor (Kubernetes, systemd) starts them again.
func WaitForRedis(c redis.UniversalClient, addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var delay time.Duration
		for {
			err := c.Ping(ctx).Err()
			if err == nil {
				return nil
			}
			delay = backoff.Reconnect.Next(delay)
			if d, ok := ctx.Deadline(); ctx.Err() != nil || ok && time.Until(d) < delay {
				return fmt.Errorf("redis (%s) does not answer: %w", addr, err)
			}
			backoff.Sleep(ctx, delay)
		}
	}
}

// wholeProcess is set by Main: the role is the whole process, so its
// process-wide settings (go-redis's logger) are the role's.
var wholeProcess atomic.Bool

// redisLog writes go-redis's lines as records of the role's logger: a
// warning when they tell of a failure, else information.
type redisLog struct{ log *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	level := slog.LevelInfo
	if l := strings.ToLower(msg); strings.Contains(l, "fail") || strings.Contains(l, "error") {
		level = slog.LevelWarn
	}
	r.log.Log(ctx, level, msg, "source", "go-redis")
}

// Main is the whole main function of role name: it calls run with the
// process's arguments and environment and a context that the first SIGTERM
// or SIGINT ends (a second one ends the process at once), then exits with
// ExitCode.
func Main(name string, run func(context.Context, Env) error) {
	wholeProcess.Store(true)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop() // the next signal takes the default action: exit now
	}()
	err := run(ctx, Env{Args: os.Args[1:]})
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode is the exit status for a run's error, after one line on stderr
// for an error: 0 for nil and ErrHelp, 2 for ErrConfig, else 1.
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, ErrHelp):
		return 0
	case errors.Is(err, ErrConfig):
		fmt.Fprintln(stderr, config.OneLine(err))
		return 2
	}
	fmt.Fprintln(stderr, name+":", config.OneLine(err))
	return 1
}
