// Package watchdog renews held leases and cancels their holders the moment a
// lease is lost (docs/design.md G4).
//
// One Watchdog per process renews every lease handed to it with Hold. Hold
// returns a context derived from the caller's that is cancelled, with a cause
// matching lock.ErrLockLost (a *lock.LostError naming the key and reason,
// or the holder's own error wrapping it, from Explain: a schedule's run
// lock names the tick that cancelled the run), when the lease is lost. The
// holder owns the lease: it ends the hold with
// Hold.Release (stop renewing, then release by token) or Hold.Stop (stop
// renewing only). The watchdog never releases a lease.
//
// # Timeline
//
// Each lease is renewed every Interval (default TTL/3). The watchdog keeps the
// send time of the last successful renewal; from the acquire on, the lease is
// trusted only until that send time + TTL − DriftMargin: the local deadline.
// Counting from the send time, not the reply, is what makes the deadline safe:
// Redis started the TTL no earlier than the request left.
//
//	acquire sent        renew sent          renew sent (no reply)
//	     |------------------|-------------------|......................x
//	     |<-- interval --->|<-- interval ----->|  retries every       |
//	                        |                                          |
//	                        |<------------ ttl − drift --------------->| deadline:
//	                        |<------------ ttl ----------------------------->| key expires
//	                                                                  cancel(unreachable)
//
// # Failure handling
//
//   - A renewal reply saying the token is gone cancels at once, with reason
//     stolen (another token holds the key) or expired (no key), and the lease
//     is never renewed again. The renew script compares the token first, so
//     the watchdog never extends a lock that is not ours.
//   - A transport error (timeout, refused, reset) is retried every
//     RetryInterval (default Interval/5) until the deadline.
//   - The deadline fires from its own timer, not from a returning Redis call,
//     so a call blocked on a paused or black-holed server cannot delay the
//     cancellation. A renewal round may not outlive the earliest deadline in
//     it. After the deadline the lease is marked lost (reason unreachable) and
//     no renewal of it is sent again.
//   - MaxHold, when set, cancels with reason max_hold at acquire + MaxHold;
//     the holder's Release then deletes the key by token, freeing it at once.
//   - Panics inside a round are recovered and counted
//     (lockstep_lock_renewals_total{result="panic"}); a panic while handling
//     one lease skips only that lease, which is retried, and the loop goes on.
//   - Stop cancels every open hold with cause ErrStopped.
//
// # Batching
//
// Leases due within a quarter interval of each other share a round. A round
// is one lock.Locker.RenewAll per Locker: on one Redis node, batches of
// lock.BatchSize leases per Lua call, all in one pipeline; on Redis Cluster,
// one pipeline per master node (a master that does not answer delays only
// its own leases); for Redlock, one pipeline per node, a lease kept while a
// quorum renews it. 10,000 held leases cost a round trip or two per node per
// interval, not 10,000.
//
// # Not guaranteed
//
// The deadline assumes the local clock and Redis's run at about the same
// rate (within DriftMargin over one TTL), and that a cancelled handler stops
// touching the resource promptly; a store that checks fencing tokens covers
// a handler that does not.
package watchdog
