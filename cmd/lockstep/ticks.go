package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

const ticksAbout = `The schedule's latest ticks, newest first: scheduled time, state (done,
pending, skipped, missed), leader replica, asynq task id and lateness (enqueue
time − scheduled time). A skipped tick has a reason: overlap (an earlier run
was queued or running), catch_up (missed in an outage) or paused (due while
the schedule was paused). A tick triggered by hand has leader
"trigger", a backfilled one "backfill". Exit codes: 0 done, 1 no such
schedule, 2 bad usage.`

// tickJSON is one tick in `lockstep ticks --json`.
type tickJSON struct {
	Tick       time.Time  `json:"tick"`
	State      string     `json:"state"`
	Leader     string     `json:"leader"`
	TaskID     string     `json:"task_id"`
	LatenessMS *int64     `json:"lateness_ms"` // done ticks only
	From       *time.Time `json:"from,omitempty"`
	Reason     string     `json:"reason,omitempty"` // skipped ticks: overlap, catch_up or paused
}

func cmdTicks(ctx context.Context, a *app, args []string) int {
	fs := a.flags("ticks", "ticks SCHEDULE [--last N] [--json]", ticksAbout)
	last := fs.Int("last", 20, "how many ticks")
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, code, done := parseN(a, fs, args, 1, "one SCHEDULE")
	if done {
		return code
	}
	if *last <= 0 {
		return usageError(a, fs, "--last must be greater than 0, got %d", *last)
	}
	name := pos[0]
	file, code := fileSchedules(a)
	if code != 0 {
		return code
	}
	st := scheduler.NewStore(a.client, a.prefix)
	ticks, err := st.Ticks(ctx, name, *last)
	if err != nil {
		fmt.Fprintln(a.stderr, err)
		return 1
	}
	if len(ticks) == 0 {
		if _, err := st.Get(ctx, name, file); errors.Is(err, scheduler.ErrNotFound) {
			fmt.Fprintf(a.stderr, "lockstep ticks: no schedule %q\n", name)
			return 1
		}
	}
	if *asJSON {
		out := make([]tickJSON, 0, len(ticks))
		for _, t := range ticks {
			j := tickJSON{Tick: t.Tick.UTC(), State: t.State, Leader: t.Leader, TaskID: t.TaskID, From: timePtr(t.From), Reason: t.Reason}
			if t.State == scheduler.TickDone {
				ms := t.Lateness.Milliseconds()
				j.LatenessMS = &ms
			}
			out = append(out, j)
		}
		return writeJSON(a, out)
	}
	tw := table(a.stdout)
	fmt.Fprintln(tw, "TICK\tSTATE\tLEADER\tTASK ID\tLATENESS")
	for _, t := range ticks {
		late := "-"
		if t.State == scheduler.TickDone {
			late = t.Lateness.String()
		}
		state := t.State
		if t.Reason != "" {
			state += " (" + t.Reason + ")"
		}
		if !t.From.IsZero() {
			state += " (after " + showTime(t.From) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", showTime(t.Tick), state, orDash(t.Leader), orDash(t.TaskID), late)
	}
	_ = tw.Flush()
	return 0
}
