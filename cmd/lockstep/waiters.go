package main

import (
	"context"
	"fmt"
	"time"
)

const waitersAbout = `Lists the tasks waiting for RESOURCE (e.g. lock:order:42), in the order they will be
served: the first is woken when the holder releases. Exit 1 when none waits.

JSON: an array of objects with position, queue, task_id, type, state (asynq's),
since_ms (first contention, Unix ms) and waited_ms.`

func cmdWaiters(ctx context.Context, a *app, args []string) int {
	fs := a.flags("waiters", "waiters RESOURCE [--json]", waitersAbout)
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	pos, code, done := parseN(a, fs, args, 1, "one RESOURCE")
	if done {
		return code
	}
	ws, err := listWaiters(ctx, a, pos[0])
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep waiters:", err)
		return exitUsage
	}
	return printList(a, *asJSON, ws, "no task waits for "+pos[0], "#\tQUEUE\tTASK\tTYPE\tSTATE\tWAITING SINCE\tWAITED",
		func(w waiterView) string {
			since := time.UnixMilli(w.SinceMs).UTC().Format("2006-01-02 15:04:05.000Z")
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s", w.Position, w.Queue, w.TaskID, orDash(w.Type),
				w.State, since, ms(w.WaitedMs))
		})
}
