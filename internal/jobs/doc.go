// Package jobs runs registered handlers for asynq tasks, each under the
// resource lock its Spec declares: the registry, the lock middleware, the
// contention requeue and the built-in demo job (docs/design.md, section 6).
//
// # Flow of one task
//
//	asynq delivers ──► decode payload ──invalid──► archived (SkipRetry), never retried
//	                        │
//	                   take.lua (one call) ──already ran under a hand-off──► its outcome, not run again
//	                        │                 │
//	                        │ busy            │ acquired (or granted)
//	                        ▼                 ▼
//	        joins the waiters (FIFO)     watchdog.Hold ──► handler(ctx, job{fence}) ──► Finish: handon.lua
//	        ContendedError (no failure)                                                   │
//	        parked in the retry set                      no one waits: released ◄─────────┤
//	                                      a waiter: the lock is granted to it in the same step,
//	                                      and this slot claims and runs it (the chain, chain.go)
//
// # Hand-off (G6; docs/design.md, section 6)
//
// A busy lock puts the task among the resource's waiters, in first-
// contention order, and back in asynq's retry set (no failure). The
// holder's release (handon.lua, run by watchdog.Hold.Finish through
// ReleaseWith: still the one end-of-hold path) grants the lock to the
// longest waiting task in the same step, so no one barges in and the next
// holder needs no acquire; the releasing worker then claims that task from
// the retry set (claim.lua) and runs it in the same slot, and so on until no
// one waits. No worker's idle poll is waited for, and a hot resource holds
// at most one slot per chain, doing work, never waiting. Per hand-off: the
// release and one claim (which also completes the task before it in asynq),
// two round trips.
//
// A claimed task stays in the retry set with its score pushed ahead: that
// score is its lease (the lock's TTL and more, renewed while it runs), so a
// chain whose worker dies leaves the task to asynq's own forwarder, which
// offers it again once the lease passes. Done markers keep a hand-off from
// running a task twice: the release that ends a run marks the task done
// with its outcome, in the same step; a delivery of a marked task (its
// chain's worker died or stopped first, or asynq completes it itself: a
// retention, a failure) returns the outcome without running it. An "ok"
// marker is read, never consumed, by such a delivery, since that delivery's
// own worker may die before asynq completes the task; it is dropped only
// once the task is gone from asynq. A handed-on task that fails is
// given back to asynq, whose delivery replays the failure, so the retry
// count and backoff are asynq's own.
//
// When no hand-off can happen (the holder crashed: its lock expires within
// its TTL), the waiters' backoff brings them back: the first in line a
// jittered moment after the lock's remaining TTL, the others at least a
// second later; a task that finds the lock free while others wait longer
// grants it to the first of them (take.lua) and waits its turn. So no lost
// wake-up stalls a resource for much more than one TTL, and order holds.
// asynq stores retry times in whole seconds and forwards a task once its
// second has begun, so the delay is rounded up to the next second
// (asynqstore.RetryDelay).
//
// # Contention and the retry budget
//
// asynq counts a retry (Retried+1) only when Config.IsFailure says the error
// is a failure; ours says no for *ContendedError, and RetryDelayFunc takes
// the delay from it. TestContentionDoesNotUseRetries shows a MaxRetry(1)
// task surviving five contentions with Retried 0.
//
// asynq archives a task whose Retried has reached its MaxRetry on any error,
// before it asks IsFailure. A task with no retries left (MaxRetry(0), or
// after its last failure) therefore cannot be requeued: it waits for its
// lock in the worker, as Wait does, until its context ends.
//
// # Rate limits (G11)
//
// A Spec with a Rate asks its key's limit (GCRA on the server's clock)
// after the payload decodes: with a lock it parks for, in the lock's own
// take (one admission: lock.Locker.Take with a TaskRate), else before the
// lock (lock.Locker.Reserve). Over the rate, the task returns a
// *RateLimitedError, which like ContendedError is no failure and carries
// its delay, and the worker wakes it at that moment (rate.go).
//
// # Contention policies
//
// Requeue (above) is the default. Skip completes the task without running
// the handler (result "skipped"): for duplicates of work already running;
// it does not join the waiters. Wait waits in the worker, up to a bound, in
// its place among the waiters: a hand-off grants it the lock and wakes it
// with a notice (pub/sub on P{R}:granted; the backoff re-asks only as the
// fallback), and its own release hands on; past the bound it is parked as
// for Requeue.
//
// # Redis keys
//
// Besides the lock's keys (internal/lock), for resource R and prefix P, under
// the lock's hash tag: P{R}:waiters, a zset of waiting tasks in serving
// order (JSON ["queue","id"] -> first contention, Unix ms with microseconds;
// it expires 3 × Backoff.Max, at least a minute, after the last contention),
// and P{R}:done:<queue>:<id>, a task's done marker (its outcome: "ok",
// "fail:<error>", "skip:<error>"; a failure's is consumed by the delivery
// that replays it; an "ok" one is dropped once a chain has completed the
// task in asynq, else it expires after a day; a task enqueued again with the
// same TaskID within that day, after a hand-off ran it, completes without
// running). A lock granted to a waiter that asynq is to deliver holds
// "g:<waiter>:<token>". In asynq's keys, a claimed task's retry score is
// its lease (internal/asynqstore, the only code that knows them). The demo
// job (internal/demo) writes Pdemo:order:<order_id>, the stream
// Pdemo:executions and the log Pdemo:writes.
//
// # Failure handling
//
//   - Lock lost while the handler ran (the watchdog cancelled its context,
//     or the release found the key gone or taken): the handler's return
//     value decides (G8 in the README's guarantees). nil is done: the task completes and is
//     never run again by Lockstep; the loss is counted
//     (lockstep_lock_lost_total) and logged with the task id. An error fails
//     the run as lock_lost (lockstep_jobs_processed_total{result=
//     "lock_lost"}) and is retried with the short backoff, not asynq's
//     default of 15 seconds and more. A crashed worker's task
//     (asynq.ErrLeaseExpired) gets the same short backoff.
//   - Handler error or panic: a failure with asynq's default backoff; the
//     lock is released first. SkipRetry archives at once.
//   - Redis error while taking the lock: a failure, retried soon.
//   - Stop: no new tasks; handlers get the shutdown timeout (less a fifth,
//     at most a second, kept to release locks); asynq then puts the tasks of
//     handlers still running back in their queues (not failures) and cancels
//     their contexts; Stop waits for them to return and releases any lock
//     still held, also of a handler that ignores its context.
//
// # Not guaranteed
//
// A crashed worker's task is delivered again only when asynq's recoverer sees
// its lease (30s, extended every 5s) expired for 30s, and the recoverer runs
// at start and then every minute: one to two minutes (asynqstore.Redelivery; a
// task a chain had claimed comes back sooner, when its own lease passes).
// The lock itself frees within one TTL. A task that a crash interrupted
// joins the waiters again at the end. The hand-off follows asynq v0.26's
// Redis layout (claim.lua completes a task as asynq's Done does, without its
// wrap of the processed total at MaxInt64); the hand-off tests fail if that
// layout changes. A handed-on task with a Retention is completed by asynq
// itself (a delivery that replays its outcome), a poll later.
package jobs
