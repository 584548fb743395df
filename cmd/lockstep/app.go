package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// app is what every subcommand gets: where to write, where to read answers
// from, and the Redis that holds Lockstep's state.
type app struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	configPath     string                // --config, may be ""
	client         redis.UniversalClient // from the config's redis section
	prefix         string                // key prefix, default "lockstep:"
	config         *config.OperatorConfig
	env            func(string) (string, bool) // the process's variables (OTEL_* for tracing)
	// locker is the lock back end the config's lock section names, with
	// prefix: every view of a lock reads it through its Locks, Held and Break.
	locker      *lock.Locker
	closeLocker func() error
}

// subcommand runs one subcommand; it returns the exit code: 0 done, 1 not
// found or nothing to do, 2 bad usage or configuration.
type subcommand func(ctx context.Context, a *app, args []string) int

// Exit codes.
const (
	exitOK       = 0
	exitNotFound = 1
	exitUsage    = 2
)

// newApp loads the configuration and builds the one Redis client, with
// go-redis options from the redis section (all three modes), and the
// Locker of the lock section (the same as the worker's and the scheduler's).
func newApp(configPath, prefix string, env func(string) (string, bool)) (*app, error) {
	cfg, err := config.LoadOperator(configPath, env)
	if err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = cfg.Lock.Prefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("--prefix %q: must not contain '{' or '}'", prefix)
	}
	client, err := cfg.Redis.NewClient()
	if err != nil {
		return nil, err
	}
	cfg.Lock.Prefix = prefix
	locker, closeLocker, err := cfg.NewLocker(client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &app{configPath: configPath, client: client, prefix: prefix, config: cfg, locker: locker, closeLocker: closeLocker}, nil
}

// close closes what newApp opened.
func (a *app) close() {
	_ = a.closeLocker()
	_ = a.client.Close()
}

// flags returns a flag set for a subcommand whose usage is usage (the line
// after "usage: lockstep ") and about (what it does).
func (a *app) flags(name, usage, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fs.SetOutput(a.stdout) // asked for: help goes to stdout
		defer fs.SetOutput(a.stderr)
		fmt.Fprintf(fs.Output(), "usage: lockstep %s\n\n%s\n", usage, about)
		if hasFlags(fs) {
			fmt.Fprintln(fs.Output(), "\nflags:")
			fs.PrintDefaults()
		}
		fmt.Fprintln(fs.Output(), "\nglobal flags: --config FILE, --prefix P (key prefix); LOCKSTEP_* variables as for the other binaries")
	}
	return fs
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parse parses args, with flags before or after the positional arguments.
// It returns the positional arguments and, when parsing ended the command
// (--help, a bad flag), its exit code.
func parse(fs *flag.FlagSet, args []string) ([]string, int, bool) {
	if wantsHelp(args) {
		fs.Usage()
		return nil, exitOK, true
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitOK, true
			}
			return nil, exitUsage, true
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, false
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseN is parse for exactly n positional arguments, named what (e.g. "one
// RESOURCE"); a wrong count is a usage error.
func parseN(a *app, fs *flag.FlagSet, args []string, n int, what string) ([]string, int, bool) {
	pos, code, done := parse(fs, args)
	switch {
	case done || len(pos) == n:
		return pos, code, done
	case n == 0:
		return nil, usageError(a, fs, "unexpected argument %q", pos[0]), true
	}
	return nil, usageError(a, fs, "want %s, got %d arguments", what, len(pos)), true
}

// printList prints rows for a list subcommand: as JSON with --json, else as
// a table under header, one line per row, or none (on stderr) when there are
// no rows. It returns exitNotFound when there are none.
func printList[T any](a *app, asJSON bool, rows []T, none, header string, line func(T) string) int {
	switch {
	case asJSON:
		writeJSON(a, rows)
	case len(rows) == 0:
		fmt.Fprintln(a.stderr, none)
	default:
		tw := table(a.stdout)
		fmt.Fprintln(tw, header)
		for _, r := range rows {
			fmt.Fprintln(tw, line(r))
		}
		_ = tw.Flush()
	}
	if len(rows) == 0 {
		return exitNotFound
	}
	return exitOK
}

// wantsHelp reports whether args ask for help (before any "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// usageError prints msg and the usage line of fs, and returns exitUsage.
func usageError(a *app, fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(a.stderr, "lockstep %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fmt.Fprintf(a.stderr, "run 'lockstep %s --help' for usage\n", fs.Name())
	return exitUsage
}

// table returns a writer that aligns tab-separated columns.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// orDash shows an empty value as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
