// Command lockstep is the operator's view of a Lockstep deployment: who holds
// which lock, since when, with which fence, who waits for it, and the
// schedules and their ticks; it can break a lock, manage run-time schedules
// and serve a live web page (lockstep ui).
//
// It reads the same configuration as the other binaries (--config, any of
// their files, and LOCKSTEP_* variables, e.g. LOCKSTEP_REDIS_ADDR). Exit
// codes: 0 done, 1 not found or nothing to do, 2 bad usage or configuration.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// commands are the subcommands by name, in the order the usage lists them.
var commands = []struct {
	name, about string
	run         subcommand
}{
	{"locks", "list every held lock: holder, job, fence, TTL left, time held, waiters", cmdLocks},
	{"waiters", "list the tasks waiting for a lock, in the order they will be served", cmdWaiters},
	{"rates", "list every live rate key: burst left and when it allows the next one", cmdRates},
	{"fair", "list each tenant with tasks waiting for its fair share: weight, backlog, share", cmdFair},
	{"unlock", "break a lock (--force): its holder is cancelled, the next holder gets a higher fence", cmdUnlock},
	{"schedules", "list schedules; add, rm, pause, resume, trigger run-time schedules", cmdSchedules},
	{"ticks", "list a schedule's recent ticks", cmdTicks},
	{"ui", "serve a live web page of locks, waiters, schedules, ticks and lock losses", cmdUI},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: lockstep [--config FILE] [--prefix P] COMMAND [ARGS]")
	fmt.Fprintln(w, "\ncommands:")
	tw := table(w)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.about)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\n--config FILE reads a worker's or scheduler's configuration; LOCKSTEP_* variables")
	fmt.Fprintln(w, "override it (LOCKSTEP_REDIS_ADDR, LOCKSTEP_REDIS_MODE, ...). --prefix overrides lock.prefix.")
	fmt.Fprintln(w, "Run 'lockstep COMMAND --help' for a command's flags. Exit codes: 0 done, 1 not found, 2 usage.")
}

// run is main without the process: it parses the global flags (anywhere on
// the line), loads the configuration and runs the subcommand.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer,
	env func(string) (string, bool)) int {
	configPath, prefix, rest, err := globalFlags(args)
	if err != nil {
		fmt.Fprintln(stderr, "lockstep:", err)
		return exitUsage
	}
	if len(rest) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := rest[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		usage(stdout)
		return exitOK
	}
	var cmd subcommand
	for _, c := range commands {
		if c.name == name {
			cmd = c.run
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "lockstep: unknown command %q\n\n", name)
		usage(stderr)
		return exitUsage
	}
	a, err := newApp(configPath, prefix, env)
	switch {
	case err != nil && wantsHelp(rest[1:]):
		a = &app{configPath: configPath, prefix: prefix} // help needs no Redis
	case err != nil:
		fmt.Fprintln(stderr, "lockstep: configuration:", err)
		return exitUsage
	default:
		defer a.close()
	}
	a.stdin, a.stdout, a.stderr, a.env = stdin, stdout, stderr, env
	return cmd(ctx, a, rest[1:])
}

// globalFlags takes --config and --prefix (as "--flag value" or
// "--flag=value", one dash or two) from anywhere before "--" and returns
// the other arguments.
func globalFlags(args []string) (configPath, prefix string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || (name != "config" && name != "prefix") {
			rest = append(rest, arg)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return "", "", nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if name == "config" {
			configPath = value
		} else {
			prefix = value
		}
	}
	return configPath, prefix, rest, nil
}
