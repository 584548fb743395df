package main

import (
	"context"
	"fmt"
	"time"
)

const waitersAbout = `Lists what waits for RESOURCE (e.g. lock:order:42), in the order it will be served
(the resource's one queue): parked tasks and WithLock / Acquire callers. The
first is handed the lock when the holder releases. Exit 1 when none waits.

JSON: an array of objects with position, kind (task or call), queue, task_id,
type, state (a task's asynq state; a call's waiting or gone), holder (a call's
process), since_ms (arrival, Unix ms) and waited_ms.`

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
	return printList(a, *asJSON, ws, "nothing waits for "+pos[0], "#\tKIND\tQUEUE\tTASK\tTYPE\tSTATE\tHOLDER\tWAITING SINCE\tWAITED",
		func(w waiterView) string {
			since := time.UnixMilli(w.SinceMs).UTC().Format("2006-01-02 15:04:05.000Z")
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", w.Position, w.Kind, orDash(w.Queue), orDash(w.TaskID), orDash(w.Type),
				w.State, orDash(w.Holder), since, ms(w.WaitedMs))
		})
}
