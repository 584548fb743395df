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
// an asynq (v0.26) client or let the Lockstep scheduler do it from cron
// entries. OnStart lends the worker's Redis client, logger and
// configuration to the program's own code. docs/quickstart.md walks through
// a service of your own (examples/orders in the repository).
//
// A worker links the etcd back end only when its program imports package
// github.com/lockstep-dev/lockstep/etcd; lock.backend etcd without it stops
// the worker at start (exit 2), naming the import. Tracing uses the
// provider passed with WithTracerProvider, else the global one
// (otel.SetTracerProvider); Lockstep's own binaries set one up from the
// OTEL_* variables.
//
// # What a handler can rely on
//
// The guarantees G3 to G8 in the repository's README; in short:
//
//   - Two handlers holding the same resource lock never run at the same
//     time, on any number of workers, while the lock's back end is healthy.
//   - When the lock is lost, the handler's context is cancelled with a cause
//     matching lockstep.ErrLockLost, before another holder can take it; after
//     the process itself was paused past its deadline, at its first check.
//   - The handler's return value decides the outcome: nil is done, and the
//     task is never run again by Lockstep, even if its lock turns out lost
//     afterwards (that loss is counted and logged); an error is retried.
//   - Job.Fence strictly increases with each acquire of the resource, so a
//     store that checks it refuses a stale holder's writes.
//   - A task whose lock is busy waits its turn in the resource's queue, in
//     arrival order, without failing and without using its retries; the
//     holder's release hands the lock to it (Requeue, the default).
//     OnContention selects Skip (a duplicate of running work completes
//     without running) or Wait (wait a bounded moment in the worker first).
//   - A worker that crashes holding a lock frees it within one lock TTL, and
//     its task runs again on a live worker within TTL + 3s, on every lock
//     back end (on etcd the lock's lease counts whole seconds, at least the
//     server's minimum).
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
// only the fence then protects the store. asynq delivers at least once: make
// handlers idempotent under their fence. docs/workers.md says more.
package worker
