// Command local runs a whole Lockstep in one process, for a first look and
// for tests: scheduler replicas and workers (2 and 3 by default) on an
// embedded Redis, a demo schedule that enqueues demo:order.pay jobs, and a
// summary line every few seconds. make run starts it.
//
//	local [--duration 0] [--every 3s] [--schedulers 2] [--workers 3] [--http-port 0]
//	      [--scheduler-config configs/local-scheduler.yaml] [--worker-config configs/local-worker.yaml]
//	      [--page-addr 127.0.0.1:8089]
//
// Redis is embedded (miniredis, in memory, gone at exit) unless
// LOCKSTEP_REDIS_ADDR names a real one. The roles are the real ones, as
// cmd/scheduler and cmd/worker run them: each scheduler replica is
// internal/scheduler.Run and each worker worker.Env.Run, with its own
// --http-addr, and the run's variables (the embedded Redis's address among
// them) passed as parameters: nothing is written to disk. Their logs (level
// warn by default, see the config files) go to stderr, the summary to stdout.
//
// When a lockstep binary lies next to this one (make run builds both), the
// run also serves the operator's page, `lockstep ui` as a child process on
// the run's Redis, at --page-addr ("" for none), and prints its URL first.
//
// --duration (or LOCKSTEP_LOCAL_DURATION) ends the run after that long; 0
// runs until SIGINT or SIGTERM. Either way the schedulers stop, the workers
// drain, and the run checks what it saw: no tick enqueued twice, no tick task
// run to success twice, no two executions of an order at once, fences rising
// per order; and, in a run of 5s or more, some ticks enqueued and jobs done.
//
// Exit codes: 0 after a clean stop with every check passed; 1 when a role
// fails or a check does not hold; 2 for a bad flag or configuration.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain runs until the duration passes or a signal arrives. A second
// signal ends the process at once.
func runMain(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // the next signal takes the default action
	}()
	return run(ctx, args, stdout, stderr, hooks{})
}
