package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// backfillJSON is one tick in `lockstep schedules backfill --json`.
type backfillJSON struct {
	Tick   time.Time `json:"tick"`
	TaskID string    `json:"task_id"`
	Result string    `json:"result"`
}

func schedulesBackfill(ctx context.Context, a *app, args []string) int {
	fs := a.flags("schedules backfill", schedulesUsage, schedulesAbout+`

backfill enqueues each past tick of NAME in [--from, --to] that was not
enqueued yet, once, with the tick's own task id, under the schedule's overlap
policy; ticks after the schedule's latest claimed tick are the scheduler's.
The range must lie within the scheduler's task_retention (from --config, else
24h) before now.`)
	fromS := fs.String("from", "", "first tick of the range (RFC3339)")
	toS := fs.String("to", "", "last tick of the range (RFC3339)")
	dry := fs.Bool("dry-run", false, "print the ticks; enqueue nothing")
	limit := fs.Int("max", scheduler.DefaultBackfillMax, "refuse a range of more ticks")
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, code, done := parseN(a, fs, args, 1, "one NAME")
	if done {
		return code
	}
	var from, to time.Time
	for _, f := range []struct {
		flag string
		raw  string
		dst  *time.Time
	}{{"--from", *fromS, &from}, {"--to", *toS, &to}} {
		if f.raw == "" {
			return usageError(a, fs, "%s is required", f.flag)
		}
		t, err := time.Parse(time.RFC3339, f.raw)
		if err != nil {
			return usageError(a, fs, "%s %q is not an RFC3339 time (e.g. 2026-01-02T03:04:05Z)", f.flag, f.raw)
		}
		*f.dst = t
	}
	if *limit <= 0 {
		return usageError(a, fs, "--max must be greater than 0, got %d", *limit)
	}
	opts := scheduler.BackfillOptions{DryRun: *dry, Max: *limit}
	var file []config.Schedule
	if a.configPath != "" {
		cfg, err := config.LoadScheduler(a.configPath, os.LookupEnv)
		if err != nil {
			fmt.Fprintln(a.stderr, err)
			return 2
		}
		file, opts.TaskRetention = cfg.Schedules, cfg.Scheduler.TaskRetention
	}
	name := pos[0]
	ticks, err := scheduler.NewStore(a.client, a.prefix).Backfill(ctx, name, file, from, to, opts)
	switch {
	case errors.Is(err, scheduler.ErrBadBackfill):
		fmt.Fprintf(a.stderr, "lockstep schedules backfill: %v\n", err)
		return 2
	case errors.Is(err, scheduler.ErrNotFound):
		fmt.Fprintf(a.stderr, "lockstep schedules backfill: no schedule %q\n", name)
		return 1
	case err != nil && len(ticks) == 0:
		fmt.Fprintln(a.stderr, err)
		return 1
	}
	if *asJSON {
		out := make([]backfillJSON, 0, len(ticks))
		for _, t := range ticks {
			out = append(out, backfillJSON{Tick: t.Tick, TaskID: t.TaskID, Result: t.Result})
		}
		if code := writeJSON(a, out); code != 0 {
			return code
		}
	} else {
		tw := table(a.stdout)
		fmt.Fprintln(tw, "TICK\tTASK ID\tRESULT")
		for _, t := range ticks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", showTime(t.Tick), t.TaskID, t.Result)
		}
		_ = tw.Flush()
	}
	if err != nil { // stopped part way: the ticks above were handled, run it again for the rest
		fmt.Fprintln(a.stderr, err)
		return 1
	}
	return 0
}
