package main

import (
	"context"
	"fmt"
)

// cmdSchedules and cmdTicks are placeholders, replaced at merge by the
// schedules and ticks subcommands.

func cmdSchedules(ctx context.Context, a *app, args []string) int {
	fmt.Fprintln(a.stderr, "lockstep schedules: not yet available")
	return 2
}

func cmdTicks(ctx context.Context, a *app, args []string) int {
	fmt.Fprintln(a.stderr, "lockstep ticks: not yet available")
	return 2
}
