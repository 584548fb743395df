// Package lock implements Lockstep's Redis locks: leases with fencing tokens.
//
// A lease is taken with one Lua call that does SET key token NX PX ttl and, on
// success, increments the resource's fencing counter. Release and renew are
// Lua compare-token scripts, so a holder can never delete or extend a lock that
// has passed to someone else, and both are safe to repeat.
//
// # Guarantees
//
//   - While one Redis master is healthy, at most one lease on a resource is
//     valid at a time (G3). A lease is valid until its acquire's send time plus
//     its TTL, unless renewed; holders that outlive that must stop (the
//     watchdog package cancels them).
//   - Fences strictly increase per resource across expiry, Locker instances
//     and processes (G5). The counter carries a long TTL refreshed on every
//     acquire; a counter created afresh starts at the Redis server's TIME in
//     microseconds, so even a counter that expired never hands out a smaller
//     fence, unless the server's clock moved back by more than the counter's
//     idle lifetime.
//   - Tokens are 128 random bits from crypto/rand.
//
// # Not guaranteed
//
// A failover of a master with asynchronous replication can lose a lock that
// the new master never saw. WaitReplicas narrows that window; fencing tokens
// protect a store that checks them; Redlock is for those who need more.
//
// # Keys
//
// For resource R and prefix P (default "lockstep:"): the lock P{R}, its
// fencing counter P{R}:fence and, for reentrant holds, P{R}:owners, a hash of
// owner id to hold count. All three share the hash tag {R}.
package lock
