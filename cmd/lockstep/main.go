// Command lockstep is the operator's CLI.
//
// Stub, replaced at merge by the CLI helper's main.go: only the schedules
// and ticks subcommands, for building and testing them.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockstep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration file (YAML)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: lockstep [--config FILE] schedules|ticks ...")
		return 2
	}
	cfg, err := config.LoadScheduler(*path, os.LookupEnv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	opts, err := cfg.Redis.UniversalOptions()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	client := redis.NewUniversalClient(opts)
	defer client.Close()
	a := &app{stdout: stdout, stderr: stderr, stdin: stdin, configPath: *path, client: client, prefix: cfg.Lock.Prefix}
	switch cmd, rest := fs.Arg(0), fs.Args()[1:]; cmd {
	case "schedules":
		return cmdSchedules(ctx, a, rest)
	case "ticks":
		return cmdTicks(ctx, a, rest)
	default:
		fmt.Fprintf(stderr, "unknown command %q\n", cmd)
		return 2
	}
}
