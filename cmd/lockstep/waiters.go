package main

import (
	"context"
	"fmt"
	"time"
)

func cmdWaiters(ctx context.Context, a *app, args []string) int {
	fs := a.flags("waiters", "waiters RESOURCE [--json]",
		"Lists the tasks waiting for RESOURCE (e.g. lock:order:42), in the order they will be\n"+
			"served: the first is woken when the holder releases. Exit 1 when none waits.\n\n"+
			"JSON: an array of objects with position, queue, task_id, type, state (asynq's),\n"+
			"since_ms (first contention, Unix ms) and waited_ms.")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	pos, code, done := parse(fs, args)
	if done {
		return code
	}
	if len(pos) != 1 {
		return usageError(a, fs, "want one RESOURCE, got %d arguments", len(pos))
	}
	ws, err := listWaiters(ctx, a, pos[0])
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep waiters:", err)
		return exitUsage
	}
	if *asJSON {
		writeJSON(a, ws)
	} else if len(ws) == 0 {
		fmt.Fprintf(a.stderr, "no task waits for %s\n", pos[0])
	} else {
		tw := table(a.stdout)
		fmt.Fprintln(tw, "#\tQUEUE\tTASK\tTYPE\tSTATE\tWAITING SINCE\tWAITED")
		for _, w := range ws {
			since := time.UnixMilli(w.SinceMs).UTC().Format("2006-01-02 15:04:05.000Z")
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", w.Position, w.Queue, w.TaskID, orDash(w.Type),
				w.State, since, ms(w.WaitedMs))
		}
		_ = tw.Flush()
	}
	if len(ws) == 0 {
		return exitNotFound
	}
	return exitOK
}
