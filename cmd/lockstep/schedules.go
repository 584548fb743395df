package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

const (
	schedulesUsage = `schedules [--json]                  list file and run-time schedules
       lockstep schedules add NAME --cron SPEC --task TYPE [--payload JSON] [--timezone TZ] [--queue Q]
                              [--max-retry N] [--timeout D] [--catch-up skip|once|all] [--max-catch-up N]
                              [--overlap allow|skip|buffer_one|cancel_previous] [--update]
       lockstep schedules pause NAME | resume NAME | rm NAME | trigger NAME
       lockstep schedules backfill NAME --from RFC3339 --to RFC3339 [--dry-run] [--max N]`
	schedulesAbout = `Run-time schedules live in Redis; every scheduler replica applies a change
within a second. File schedules (from --config) can be paused, resumed and
triggered, not changed. Exit codes: 0 done, 1 not found or nothing to do,
2 bad usage or a bad schedule.`
)

// scheduleJSON is one schedule in `lockstep schedules --json`.
type scheduleJSON struct {
	Name     string     `json:"name"`
	Cron     string     `json:"cron"`
	Timezone string     `json:"timezone"`
	Task     string     `json:"task"`
	Paused   bool       `json:"paused"`
	Source   string     `json:"source"`
	LastTick *time.Time `json:"last_tick"`
	NextTick *time.Time `json:"next_tick"`
	Overlap  string     `json:"overlap"`
	Running  string     `json:"running,omitempty"` // the running run's task id (overlap other than allow)
	Queued   int        `json:"queued,omitempty"`  // runs queued behind it
}

func cmdSchedules(ctx context.Context, a *app, args []string) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "add":
			return schedulesAdd(ctx, a, args[1:])
		case "pause", "resume", "rm", "trigger":
			return schedulesByName(ctx, a, args[0], args[1:])
		case "backfill":
			return schedulesBackfill(ctx, a, args[1:])
		}
		return usageError(a, a.flags("schedules", schedulesUsage, schedulesAbout), "unknown subcommand %q", args[0])
	}
	fs := a.flags("schedules", schedulesUsage, schedulesAbout)
	asJSON := fs.Bool("json", false, "print a JSON array")
	if _, code, done := parseN(a, fs, args, 0, ""); done {
		return code
	}
	file, code := fileSchedules(a)
	if code != 0 {
		return code
	}
	all, err := scheduler.NewStore(a.client, a.prefix).List(ctx, file)
	if err != nil {
		fmt.Fprintln(a.stderr, err)
		return 1
	}
	if *asJSON {
		out := make([]scheduleJSON, 0, len(all))
		for _, in := range all {
			out = append(out, scheduleJSON{Name: in.Schedule.Name, Cron: in.Schedule.Cron, Timezone: in.Schedule.Timezone,
				Task: in.Schedule.Task, Paused: in.Paused, Source: in.Source, LastTick: timePtr(in.LastTick), NextTick: timePtr(in.NextTick),
				Overlap: string(cmp.Or(in.Schedule.Overlap, config.OverlapAllow)), Running: in.Running, Queued: in.Queued})
		}
		return writeJSON(a, out)
	}
	tw := table(a.stdout)
	fmt.Fprintln(tw, "NAME\tCRON\tTIMEZONE\tTASK\tSOURCE\tPAUSED\tLAST TICK\tNEXT TICK")
	for _, in := range all {
		s := in.Schedule
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%s\t%s\n", s.Name, s.Cron, s.Timezone, s.Task, in.Source, in.Paused,
			showTime(in.LastTick), showTime(in.NextTick))
	}
	_ = tw.Flush()
	return 0
}

func schedulesAdd(ctx context.Context, a *app, args []string) int {
	fs := a.flags("schedules add", schedulesUsage, schedulesAbout)
	s := config.NewSchedule()
	fs.StringVar(&s.Cron, "cron", "", "cron expression (5 fields, or 6 with seconds first; @daily; @every 5m)")
	fs.StringVar(&s.Task, "task", "", "asynq task type")
	payload := fs.String("payload", "", "task payload, a JSON object")
	fs.StringVar(&s.Timezone, "timezone", s.Timezone, "IANA time zone")
	fs.StringVar(&s.Queue, "queue", s.Queue, "asynq queue")
	fs.IntVar(&s.MaxRetry, "max-retry", s.MaxRetry, "retries of a failed task")
	fs.DurationVar(&s.Timeout, "timeout", 0, "task timeout (0: asynq's default)")
	catchUp := fs.String("catch-up", string(s.CatchUp), "missed ticks after an outage or a pause: skip, once or all")
	fs.IntVar(&s.MaxCatchUp, "max-catch-up", 0, "cap for --catch-up all (0: the scheduler's max_catch_up)")
	overlap := fs.String("overlap", string(s.Overlap), "a tick while an earlier run is queued or running: allow, skip, buffer_one or cancel_previous")
	update := fs.Bool("update", false, "replace the run-time schedule NAME if it exists")
	pos, code, done := parseN(a, fs, args, 1, "one NAME")
	if done {
		return code
	}
	s.Name, s.CatchUp, s.Overlap = pos[0], config.CatchUp(*catchUp), config.Overlap(*overlap)
	if *payload != "" {
		s.Payload = json.RawMessage(*payload)
	}
	file, code := fileSchedules(a)
	if code != 0 {
		return code
	}
	for _, f := range file {
		if f.Name == s.Name {
			fmt.Fprintf(a.stderr, "lockstep schedules add: %s is a file schedule (%s); change it there\n", s.Name, a.configPath)
			return 2
		}
	}
	st := scheduler.NewStore(a.client, a.prefix)
	err := st.Add(ctx, s)
	verb := "added"
	if *update && errors.Is(err, scheduler.ErrExists) {
		err, verb = st.Update(ctx, s), "updated"
	}
	switch {
	case err == nil:
		fmt.Fprintf(a.stdout, "schedule %s %s: %s, task %s, queue %s (every replica applies it within 1s)\n", s.Name, verb, s.Cron, s.Task, s.Queue)
		return 0
	case errors.Is(err, scheduler.ErrExists):
		fmt.Fprintf(a.stderr, "lockstep schedules add: schedule %s exists already (use --update to replace it)\n", s.Name)
		return 1
	case errors.Is(err, scheduler.ErrFileSchedule):
		fmt.Fprintf(a.stderr, "lockstep schedules add: %s is a file schedule; change it in the config file\n", s.Name)
		return 2
	}
	var ce *config.Error
	if errors.As(err, &ce) {
		fmt.Fprintf(a.stderr, "lockstep schedules add: %v\n", err)
		return 2
	}
	fmt.Fprintln(a.stderr, err)
	return 1
}

func schedulesByName(ctx context.Context, a *app, verb string, args []string) int {
	fs := a.flags("schedules "+verb, schedulesUsage, schedulesAbout)
	pos, code, done := parseN(a, fs, args, 1, "one NAME")
	if done {
		return code
	}
	name := pos[0]
	file, code := fileSchedules(a)
	if code != 0 {
		return code
	}
	isFile := false
	for _, f := range file {
		isFile = isFile || f.Name == name
	}
	st := scheduler.NewStore(a.client, a.prefix)
	var err error
	switch verb {
	case "pause", "resume":
		var changed bool
		changed, err = st.SetPaused(ctx, name, verb == "pause", isFile)
		if err == nil && !changed {
			fmt.Fprintf(a.stdout, "schedule %s was %sd already\n", name, verb)
			return 1
		}
		if err == nil {
			fmt.Fprintf(a.stdout, "schedule %s %sd\n", name, verb)
		}
	case "rm":
		if isFile {
			fmt.Fprintf(a.stderr, "lockstep schedules rm: %s is a file schedule; remove it from %s (or pause it)\n", name, a.configPath)
			return 2
		}
		if err = st.Remove(ctx, name); err == nil {
			fmt.Fprintf(a.stdout, "schedule %s removed\n", name)
		}
	case "trigger":
		tp, endTracing, terr := tracing.ForRole(nil, a.env, "lockstep", a.stderr) // OTEL_*: the triggered run's trace
		if terr != nil {
			fmt.Fprintln(a.stderr, "lockstep schedules trigger:", terr)
			return 2
		}
		defer endTracing()
		var id string
		if id, err = st.Traced(tp).Trigger(ctx, name, file); err == nil {
			fmt.Fprintf(a.stdout, "schedule %s triggered: task %s\n", name, id)
		}
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, scheduler.ErrNotFound):
		fmt.Fprintf(a.stderr, "lockstep schedules %s: no schedule %q\n", verb, name)
		return 1
	case errors.Is(err, scheduler.ErrSkippedOverlap):
		fmt.Fprintf(a.stdout, "schedule %s: trigger skipped: an earlier run is queued or running (overlap policy)\n", name)
		return 1
	}
	fmt.Fprintln(a.stderr, err)
	return 1
}

// fileSchedules loads the schedules of the config file, nil without one.
func fileSchedules(a *app) ([]config.Schedule, int) {
	if a.configPath == "" {
		return nil, 0
	}
	cfg, err := config.LoadScheduler(a.configPath, os.LookupEnv)
	if err != nil {
		fmt.Fprintln(a.stderr, err)
		return nil, 2
	}
	if cfg.Schedules == nil {
		return []config.Schedule{}, 0
	}
	return cfg.Schedules, 0
}

func writeJSON(a *app, v any) int {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(a.stderr, err)
		return 1
	}
	return 0
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func showTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
