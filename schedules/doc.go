// Package schedules changes Lockstep's cron schedules while the scheduler
// replicas run: add, update, remove, pause, resume, trigger one tick now, and
// backfill a past range. It is the Go side of `lockstep schedules`; the
// schedules of the scheduler's config file need neither.
//
//	c := schedules.New(redisClient)
//	err := c.Add(ctx, schedules.Schedule{
//		Name: "report-acme", Cron: "0 0 * * * *", Task: "report:build",
//		Payload: json.RawMessage(`{"customer":"acme"}`),
//	})
//
// Run-time schedules live in Redis beside the ones in the scheduler's config
// file, which stay as they are. Every change is one atomic script that also
// publishes a notice; every replica applies it within a second (the notice,
// or its periodic resync when a notice was lost), without a restart. A change
// is validated exactly like a config file's entry (cron, time zone, task,
// payload, queue, catch-up) and a bad one is refused with the same message,
// naming the field, and nothing is stored.
//
// # Ticks and watermarks
//
// Each schedule has a watermark in Redis: its latest tick claimed (or
// dropped by the catch-up policy). Ticks never go backwards.
//
//   - Add: the schedule's first due tick is the first after the add.
//   - Update with a changed cron or time zone: the new spec takes effect at
//     the update; its ticks before it are not due and never replayed, even
//     with catch_up once or all. An update of anything else keeps the spec's
//     start, so nothing is skipped or replayed.
//   - Pause: replicas stop claiming its ticks. Resume: the ticks missed while
//     paused follow the schedule's catch-up policy (skip: none; once: the
//     latest; all: up to max_catch_up), as after an outage.
//   - Remove: the watermark stays (for its TTL), so a schedule added again
//     under the name never enqueues a tick twice.
//
// # Overlap and backfill
//
// A schedule's Overlap (allow, skip, buffer_one, cancel_previous) decides a
// tick while an earlier run is queued or running; triggers and backfills
// follow it too. Backfill enqueues each past tick of a range that was not
// enqueued yet, with the tick's own task id, so that no tick runs twice; a
// range older than the scheduler's task retention is refused
// (ErrBadBackfill). docs/scheduler.md says more.
//
// # Trigger
//
// Trigger enqueues one task of the schedule at once, paused or not, with the
// asynq task id "<schedule>:trigger:<unix ms>-<random hex>", distinct from a
// cron tick's "<schedule>:<unix seconds>".
//
// File schedules can be paused, resumed and triggered too (replicas register
// them in Redis at start); they cannot be added, updated or removed here: a
// run-time schedule with a file schedule's name is refused, and replicas
// whose file has that name ignore it.
package schedules
