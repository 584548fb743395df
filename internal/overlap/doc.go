// Package overlap keeps a schedule's runs, for its overlap policy (config
// key overlap): allow, skip, buffer_one, cancel_previous.
//
// A run is one tick's asynq task from its enqueue until it completes, fails
// its last retry or is archived. The schedule's live runs are kept in one
// small hash beside the scheduler's keys of the schedule, and the run that
// is running holds the schedule's run lock, a resource of internal/lock
// ("schedule:<name>"; its key is built by lock.ScheduleRun):
//
//	P{schedule:N}:runs  hash: task id -> "q <ms>" queued (since Redis ms), "q" queued again, "r" running,
//	                    "x <task id>" ended: cancelled for that task's tick (cancel_previous)
//	P{schedule:N}       the run lock, held by the worker of the running run
//
// # At a tick (Tick; one per tick, no polling)
//
// The replica that won the tick reads runs, asks asynq's Inspector for the
// state of each task id in it (at most a few: ended runs are removed), and
// calls tick.lua, which classifies each run and decides atomically with the
// run lock's state:
//
//	asynq state                      runs value   the run
//	pending, scheduled, retry        any          queued
//	active                           q            queued (its worker waits for the run lock, or just took it)
//	active                           r            running while the run lock is held; else ended (its worker died)
//	unknown to asynq                 q <ms>       queued while its tick is pending or for a grace; else ended
//	completed, archived, unknown     -            ended
//	any                              x <id>       ended (removed)
//
// skip enqueues the tick only with no live run; buffer_one with no queued
// run; cancel_previous marks every live run ended ("x <new task id>") and
// ends the run lock's hold through the lock (Locker.Break, which hands it
// to the next run waiting for it), so the running run's watchdog cancels its context
// at once, the same path as a lost lock (the README's guarantee G4), with
// the cause CancelledError: it wraps the run lock's *lock.LostError
// (errors.Is(cause, lock.ErrLockLost)) and names the new tick, read from the
// mark (Run.Cancelled, the hold's watchdog.Explain). The next run's fence is
// higher: a fenced store refuses the cancelled run's late writes. A tick
// that runs is registered "q <ms>" before it is enqueued, so a slow enqueue
// does not look like no run. A trigger and each tick of a backfill are
// decided the same way.
//
// # On the worker (Begin, Run.Finish)
//
// The scheduler marks the task with the headers HeaderSchedule and
// HeaderPolicy (never the user's payload). The worker of such a task takes
// the run lock (waiting in line behind a running run: buffer_one), then
// start.lua marks it running, unless the run has ended meanwhile (a later
// tick cancelled it, or found it ended): then the task is not run. When the
// handler returns, finish.lua removes the run, or queues it again if asynq
// will retry it, before the run lock is released.
//
// # Guarantees (G9 in the README's guarantees)
//
//   - skip: no tick is enqueued while another run is queued or running;
//     buffer_one: at most one run is queued behind the running one. A
//     worker killed mid-run ends the run within the run lock's TTL.
//   - A skipped tick is recorded in the schedule's history as skipped, with
//     reason overlap, and counted skipped_overlap.
//
// # Not guaranteed
//
//   - A worker that dies while its run waits for the run lock (or between
//     taking the task and taking the lock) leaves the run queued until
//     asynq's own lease gives the task back, and then it runs.
//   - A run whose handler's lock is busy waits for it in its worker, under
//     the run lock (internal/jobs turns Requeue and Wait into an unbounded
//     wait for schedule runs), so the hand-off chain, which runs tasks
//     without this entry, does not take it. One parked when its context
//     ended (a worker's shutdown) may be handed on: it then runs without the
//     run lock and counts as queued (skip and buffer_one hold), and
//     cancel_previous cannot cancel it.
//   - A run ended by a later tick (its worker judged dead) that asynq
//     delivers again does not run.
//   - The cancelled run's cause names the new tick only if its worker reads
//     the mark within 50 ms of finding the run lock gone, and before a
//     later tick removes it (a worker that notices only at its next renewal,
//     TTL/3 on, with ticks every second); otherwise it is the watchdog's
//     plain ErrLockLost for the run lock (reason expired or stolen).
package overlap
