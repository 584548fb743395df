// Package worker runs job handlers written in Go, each under a resource lock
// declared from its payload, in your own worker binary.
//
//	type Pay struct {
//		OrderID string `json:"order_id"`
//	}
//
//	func pay(ctx context.Context, job worker.Job, p Pay) error {
//		// ctx ends if the lock is lost; job.Fence goes with every write.
//		return charge(ctx, p.OrderID, job.Fence)
//	}
//
//	func main() {
//		worker.Main(worker.Handle("order:pay", pay).
//			Lock(func(p Pay) string { return "lock:order:" + p.OrderID }, 30*time.Second))
//	}
//
// Main is the whole binary: flags --config and --http-addr, LOCKSTEP_*
// environment variables, /metrics, /healthz and /readyz, graceful shutdown
// on SIGTERM. It behaves exactly like the default cmd/worker, which is
// Main(DemoJob()): the built-in demo:order.pay job and no handlers of its
// own. A worker of yours registers the demo job only when asked (DemoJob, or
// worker.demo: true in the configuration).
//
// Tasks are asynq tasks: a type, a JSON payload, a queue. Enqueue them with
// an asynq client or let the Lockstep scheduler do it from cron entries.
//
// # What a handler can rely on
//
//   - While one Redis master is healthy, two handlers holding the same
//     resource lock never run at the same time, on any number of workers.
//   - When the lock is lost (the key expired, was deleted or taken, or Redis
//     could not be reached to renew it), the handler's context is cancelled
//     with a cause matching lockstep.ErrLockLost, before another holder can
//     take it: within milliseconds of a change to the key (a server notice;
//     the notices run while some lock of the worker is 50ms old or more, so
//     a loss in a lock's first 50ms is seen a few milliseconds after it
//     turns 50ms old), at the local deadline when Redis is unreachable, and
//     at the first check after the process itself was paused past that
//     deadline.
//   - The handler's return value decides the outcome: nil is done, and the
//     task is never run again by Lockstep, even if its lock turns out lost
//     afterwards (that loss is counted in lockstep_lock_lost_total and
//     logged with the task id); an error is retried, soon and recorded
//     lock_lost when the lock was lost too. Retrying work that returned nil
//     cannot undo its side effects, only repeat them.
//   - Job.Fence strictly increases with each acquire of the resource, also
//     across worker restarts, so a store that checks it refuses a stale
//     holder's writes.
//   - A task whose lock is busy is put back in its queue with jittered
//     backoff, and offered again as soon as the holder releases the lock. It
//     does not count as a failure and does not use the task's retries (its
//     Attempt does not grow); no worker waits on a busy lock. One exception:
//     a task with no retries left (asynq would archive it on any error)
//     waits for the lock in the worker, until its deadline. This is the
//     Requeue policy; OnContention selects Skip (a duplicate of running work
//     completes without running) or Wait (wait a bounded moment in the
//     worker first) per handler.
//   - A worker that crashes holding a lock frees it within one lock TTL; the
//     task is delivered again once asynq sees that the worker's lease on it
//     has expired (asynq's fixed timing: about a minute to two).
//   - A payload that does not decode, or whose Validate method fails, is
//     archived at once with the reason as the task's last error.
//   - SIGTERM (or the end of Run's context) stops taking tasks, lets running
//     handlers finish within worker.shutdown_timeout, then cancels the rest
//     (their tasks go back to the queue, not counted as failures), releases
//     every lock and returns.
//
// # What it does not promise
//
// A Redis master failover with asynchronous replication can lose a lock
// (lock.wait_replicas narrows the window; fencing protects the store). A
// handler that ignores its context keeps running after its lock is lost;
// only the fence then protects the store. Retries of failed handlers are at
// least once: make handlers idempotent, or check the fence.
package worker
