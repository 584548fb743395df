// Package lock implements Lockstep's locks: leases with fencing tokens.
//
// # Back ends
//
// A Locker has one back end, chosen by its constructor: New (single: one
// Redis deployment, a server, a Sentinel-managed master or a Cluster),
// NewRedlock (a quorum of independent Redis masters) or NewEtcd (an etcd
// cluster). Each is one type behind a small interface (backend.go: acquire,
// renew a batch, release); the Locker keeps what they share: tokens, the
// lease's final state, reentrant owners, waiting with backoff, metrics. An
// Option that does not apply to the chosen back end is rejected (the
// constructor panics naming it), never ignored. The Redis back ends are made
// of the same per-node operations (redis_node.go: acquire, renew a batch,
// release, raise a fence), each one Lua script run through the one script
// runner (scripts.go: EVALSHA with the NOSCRIPT fallback, also in pipelines).
// A back end that hears of a loss from its store (etcd's watch) offers it
// through Locker.NotifyLoss.
//
// On Redis, a lease is taken with one Lua call that does SET key token NX PX
// ttl and, on success, advances the resource's fencing counter (one SET ...
// GET of the counter and TIME). Release and renew are Lua compare-token
// scripts, so a holder can never delete or extend a lock that has passed to
// someone else, and both are safe to repeat.
//
// # Shared calls
//
// acquire.lua and release.lua each take any number of locks. On one server
// (not a Cluster, whose locks live in different slots) concurrent acquires
// of a Locker share one script call, and so do concurrent releases
// (batch.go): a caller that finds no call in flight sends its own at once,
// callers arriving meanwhile go together in the next call. A lone caller
// pays nothing; 64 concurrent cycles cost a few script calls per round trip
// instead of 128, on both sides of the connection.
//
// # Waiting
//
// Acquire on one Redis deployment waits in the resource's queue, in arrival
// order (wait.go): the release hands the lock to the first live waiter (the
// lock key is set to that waiter's token, with a fresh fence: one write) and
// pushes the hand-off to the waiter's wake list, on which it blocks (BLPOP,
// at most half the pool's connections at a time), so it wakes holding the
// lock. While waiters are queued the lock is free only for the first of
// them, TryAcquire included. The backoff's longest delay bounds each
// blocking wait, the fallback for a holder that crashed instead of
// releasing; a waiter keeps its entry alive for its TTL, so a crashed one is
// skipped after that (or, handed the lock just before it crashed, holds it
// for its TTL like any crashed holder); a waiter whose Acquire ends leaves
// the queue. Redlock and WaitReplicas retry with the backoff; etcd too, and
// a release wakes the longest waiter of each process.
//
// # Guarantees
//
//   - While one Redis master is healthy, at most one lease on a resource is
//     valid at a time (G3). A lease is valid until its acquire's send time plus
//     its TTL, unless renewed; holders that outlive that must stop (the
//     watchdog package cancels them).
//   - Fences strictly increase per resource across expiry, Locker instances
//     and processes (G5). Each acquire sets the counter to max(counter + 1,
//     the Redis server's TIME in microseconds), so a counter that expired, or
//     whose last writes a failover lost, still never hands out a smaller
//     fence, unless the server's clock moved back by more
//     than the time since the last acquire (or the new master's clock is that
//     far behind the old one's).
//   - Tokens are 128 random bits from crypto/rand.
//
// # Not guaranteed
//
// A failover of a master with asynchronous replication can lose a lock that
// the new master never saw, and with it the fencing counter's last write;
// the next holder still gets a higher fence (from the new master's clock),
// so a store that checks fences refuses the lost holder's later writes, but
// the two holders may run at the same time until the watchdog's next renewal
// cancels the first. WaitReplicas narrows that window (an acquire the replicas did not
// acknowledge fails); Redlock is for those who need more. Renewals are not
// waited for: a ttl shorter than a failover takes can let the lock expire on
// the new master (the watchdog then cancels the holder at its next renewal).
//
// # Redis Cluster
//
// The keys of one resource share a hash tag, so every script runs on one
// slot. RenewAll sends one pipeline per master, and a master that does not
// answer gets half the time left before the round's deadline, so it cannot
// delay the other masters' renewals: only its own leases are lost
// (unreachable). A master that restarts empty loses its locks and counters;
// fresh counters start at its clock in microseconds.
//
// # Redlock
//
// NewRedlock holds a lease on a quorum Q = N/2+1 of N independent masters.
// An acquire runs acquire.lua on all nodes at once (each bounded by the node
// timeout) and keeps the lease when Q granted it and validity is left:
// ttl − elapsed − drift > 0, elapsed counted from the send time; otherwise it
// releases on every node. A renewal keeps the lease while Q renew it; the
// token gone from more than N − Q nodes is a loss (quorum_lost); anything
// else is a transport error, which the watchdog retries until its deadline
// (unreachable). Mutual exclusion holds under Redlock's assumptions: clocks
// that run at about the same rate (the drift allowance), and nodes that keep
// their data while a lease is live (persistence with fsync, or a restarted
// node kept out for one ttl).
//
// Redlock fences: each node has its own counter. A lease's fence is the
// highest counter among the nodes that granted it, and before the acquire
// returns, a quorum of the granting nodes must have their counter at that
// value while still holding the token: the nodes whose increment returned it,
// and the others lifted to it (fence_raise.lua); the acquire fails otherwise.
// Any later holder's quorum shares a node with that quorum, can set its key
// there only after ours is gone, and so increments past our fence.
//
//   - Promised: if acquire A returned before acquire B was sent, B's fence is
//     greater than A's, whatever the clocks, pauses and network delays did,
//     as long as no node lost its data in between. A holder that was paused
//     past its lease and writes late is therefore rejected by a store that
//     keeps the highest fence it accepted, once the next holder has written.
//   - Not promised: fences are not dense and not shared across resources;
//     two acquires that overlap in time (possible only when clocks or pauses
//     break Redlock's own assumptions) are not ordered; a node that restarts
//     without its data restarts its counter at its clock in microseconds,
//     which keeps fences increasing only while that clock is not behind the
//     clock of the node that issued the last fence by more than the time
//     since; fences from a Redlock Locker and from New on the same keys are
//     different counters.
//
// # etcd
//
// NewEtcd keeps the lock on resource R as the key P{R}, created in a
// transaction only if absent and bound to an etcd lease; its value is the
// token, the revision that wrote it the fence (etcd's revision only grows,
// so fences strictly increase across holders, restarts and resources).
// Waiting Acquires hold places in line, keys P{R}:queue:<id> ordered by
// their create revisions, and a release hands the lock to the first by
// rewriting the key (etcd_queue.go). Release deletes or hands on the key in
// a transaction that compares token and revision. Renewal
// is a keep-alive of the lease and a read of the key; a watch on the lock
// keys reports a deleted key (expired) or an overwritten one (stolen) at
// once. Reentrant holds count in P{R}:owners, changed by compare-and-swap.
// etcd.go says why the concurrency package is not used, and what the
// whole-second lease TTLs mean.
//
// # Keys
//
// For resource R and prefix P (default "lockstep:"): the lock P{R}, its
// fencing counter P{R}:fence and, for reentrant holds, P{R}:owners, a hash of
// owner id to hold count; while Acquire calls wait, the queue P{R}:queue (a
// zset of waiter ids by arrival), each waiter's hash P{R}:queue:W (its token,
// TTL and owner) and wake list P{R}:queue:W:wake, all with TTLs. All share the hash tag {R}.
// A resource with a limit N > 1 (Permits) has N permits: permit 0 is P{R}
// itself, permit k > 0 is P{R}:p<k> with its own counter P{R}:fence:<k> and
// owners hash P{R}:owners:<k>; the hash P{R}:limit keeps the resource's
// limit (lua/lib.lua says how). On etcd the permits' keys are the same,
// without counters (fences are revisions), and P{R}:limit is a key
// holding the limit (NewEtcd says how), and P{R}:queue:<id> are the places
// of waiting Acquires (etcd_queue.go).
// Redlock uses the same lock, counter and owners keys on every node.
//
// The counter's lifetime: every acquire, hand-off, fence raise and renewal
// gives it the lock's ttl plus the fence TTL (WithFenceTTL), so it lives
// while its lock does and for at least the fence TTL after the lock's end
// (a release or an expiry). A fence is the server's TIME in microseconds
// unless the counter is ahead of that clock, and it can be ahead only by as
// much as a clock went back (a stepped clock, a new master's or another
// Redlock node's clock behind the one that issued it); so with clocks within
// max_clock_skew of each other, a counter older than that past its lock's
// end is never needed, and the default fence TTL is the default
// max_clock_skew, 2s. A re-entry and `lockstep locks` read the counter as the
// holder's fence, which is why it lives as long as its lock.
package lock
