// Package jobs runs registered handlers for asynq tasks, each under the
// resource lock its Spec declares: the registry, the lock middleware, the
// contention requeue and the built-in demo job (DESIGN.md section 6).
//
// # Flow of one task
//
//	asynq delivers ──► decode payload ──invalid──► archived (SkipRetry), never retried
//	                        │
//	                   resource name ──► TryAcquire (once)
//	                        │                 │
//	                        │ busy            │ acquired
//	                        ▼                 ▼
//	        count, join the waiters      watchdog.Hold ──► handler(ctx, job{fence}) ──► Release
//	        ContendedError (no failure)                         │                        │
//	        retry in Backoff.Nth(n+ahead)         lock lost: ctx cancelled     released: wake the
//	        or at the next release's wake-up      run fails, retried soon      longest waiter now
//
// # Contention and the retry budget (G6)
//
// asynq counts a retry (Retried+1) only when Config.IsFailure says the error
// is a failure; ours says no for *ContendedError, and RetryDelayFunc takes
// the delay from it. TestContentionDoesNotUseRetries shows a MaxRetry(1)
// task surviving five contentions with Retried 0.
//
// asynq archives a task whose Retried has reached its MaxRetry on any error,
// before it asks IsFailure. A task with no retries left (MaxRetry(0), or
// after its last failure) therefore cannot be requeued: it waits for its
// lock in the worker, with the same backoff, until its context ends.
//
// The backoff is decorrelated jitter (backoff.Jitter.Nth) that grows with the
// task's contentions and with the waiters ahead of it, capped at Backoff.Max.
// asynq stores retry times in whole seconds and forwards a task once its
// second has begun, so the delay is rounded up to the next second: it is
// never shorter than asked, and a busy lock is never retried in a spin. The
// backoff is only the fallback, though: every release moves the longest
// waiting task for the resource from the retry set to the head of its queue
// (wake.lua, in asynq's layout), so a hot resource passes from one job to the
// next without idling. A wake-up can be lost (the holder crashed, the lock
// expired, the waiter was still on its way to the retry set); the backoff
// then brings the task back.
//
// # Contention policies
//
// Requeue (above) is the default. Skip completes the task without running
// the handler (result "skipped"): for duplicates of work already running.
// Wait first waits in the worker, with the backoff, up to a bound, then
// requeues: for short critical sections.
//
// # Redis keys
//
// Besides the lock's keys (internal/lock), for resource R and prefix P, under
// the lock's hash tag: P{R}:waiters, a zset of waiting tasks (JSON
// ["queue","id"] -> first contention, Unix ms), and P{R}:contended:<queue>:<id>,
// a task's contention count. Both expire on their own (3 × Backoff.Max, at
// least a minute, after the last contention). The demo job (internal/demo)
// writes Pdemo:order:<order_id>, the stream Pdemo:executions and the log
// Pdemo:writes.
//
// # Failure handling
//
//   - Lock lost while the handler ran (the watchdog cancelled its context,
//     or the release found the key gone or taken): the handler's return
//     value decides (DESIGN.md G8). nil is done: the task completes and is
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
// at start and then every minute: one to two minutes, asynq's constants. The
// lock itself frees within one TTL. Wake-ups follow asynq v0.26's Redis
// layout; TestContentionWakesNextWaiter fails if that layout changes.
package jobs
