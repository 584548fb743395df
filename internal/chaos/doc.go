// Package chaos is the seeded fault harness and the history checker behind
// `make chaos` (the README's guarantees; docs/chaos.md).
//
// Run starts the real binaries (3 cmd/scheduler replicas, 3 cmd/worker
// processes, each worker behind its own TCP proxy) on a redis-server that
// persists every write before replying (appendonly yes, appendfsync always),
// enqueues demo:order.pay jobs on a few hot orders and demo:tenant.sync jobs
// on two tenants of limit 3, and injects a fault
// schedule drawn from a seed: SIGKILL and restart of a worker (also during its
// SIGTERM drain) or a scheduler (at a random offset inside a tick), SIGSTOP of
// a worker or of Redis for less and for more than the lock TTL, SIGKILL of
// Redis and restart from its AOF, and a worker's link black-holed and healed.
// With Config.Store "postgres" the workers keep the demo's fenced store in a
// private PostgreSQL (internal/sqltest) and the checker reads its log table.
// With Config.Redis "cluster" the queue and the locks live on a private
// Redis Cluster of 3 masters with a replica each (the binaries in
// redis.mode cluster), and the faults are the Cluster's: a master killed
// and its replica promoted, a master paused for less and for more than the
// node timeout (then its replica takes over), a replica killed.
//
// Check then reads what happened from the history, not from asynq's
// bookkeeping alone:
//
//   - the demo's executions stream (order, fence, worker, task, start, end,
//     outcome): overlapping ok runs of one order, or of one tenant's permit,
//     while Redis was healthy (G3), more syncs of a tenant at once than its
//     limit (over_limit), and tasks completed more than once (G8 and asynq's
//     at-least-once);
//   - the demo store's log of accepted fenced writes (a Redis stream, or the
//     PostgreSQL store's table), when the demo keeps one:
//     a write accepted with a fence below one that had already begun (G5),
//     per order and per (tenant, permit);
//   - on a Cluster, the runs of a failed-over master's resources that were
//     still running when the store accepted the next holder's begin (a
//     failover may lose a lock, DESIGN §1; its holder must be cancelled
//     before the next begins its work), and what each failover cost;
//   - every scheduler replica's own log lines of each tick it claimed and
//     enqueued: ticks claimed by two replicas (G1, claims, not task ids);
//   - asynq's final task states: produced jobs never completed (G7) and ticks
//     without a task (G2).
//
// What it does not promise: a check whose input is missing or incomplete (a
// trimmed stream, a job still unfinished when the drain ended, a write log the
// demo does not keep) is reported as not available or incomplete, never as a
// zero. A replica killed between its claim and its log line leaves a claim
// nobody sees: claims can be undercounted, never invented.
package chaos
