// Package scheduler runs Lockstep's cron schedules on any number of replicas
// and enqueues each tick of each schedule into asynq exactly once.
//
// Every replica runs every schedule: those of its config file, and the
// run-time ones stored in Redis (Store; the public package schedules). At a
// tick's scheduled time T (not the wall-clock time of the wake-up) the
// schedule's first claimer calls one Lua script that claims the tick; the
// others call it claimGrace later, which answers at once unless the first
// claimer is dead or slow. The winner enqueues the schedule's task with the
// asynq task id "<schedule>:<T as Unix seconds>" and then marks the tick done.
//
// # Keys
//
// For schedule N and prefix P (default "lockstep:"), all sharing the hash tag
// {schedule:N}, so each script runs on one Redis Cluster slot:
//
//	P{schedule:N}:state      hash: tick (the watermark: highest tick claimed or skipped), leader,
//	                         and p:<T> = "<lease end, Redis ms> <token>" for each tick T claimed
//	                         and not yet done: the tick's leader lease (tick_lock_ttl)
//	P{schedule:N}:history    list of the latest ticks' records (JSON), newest first (lockstep ticks)
//
// state and history carry a TTL of at least 400 days, set when the watermark
// enters a new UTC day (so once a day, not at every claim). The run-time
// schedules and the replicas share the tag {schedules}:
//
//	P{schedules}:defs         hash: name -> definition (JSON)
//	P{schedules}:meta         hash: name -> since, paused, spec, updated_ms, paused_ms, resumed_ms (JSON)
//	P{schedules}:file         hash: name -> definition of the file schedules live replicas run
//	P{schedules}:file:<id>    set: the file schedules replica id declares (TTL: 10 × replicaExpiry,
//	                          refreshed by its heartbeat)
//	P{schedules}:version      counter of changes; P{schedules}:changed is the pub/sub channel
//	P{schedules}:replicas     zset: live replica -> last heartbeat (server ms)
//	P{schedules}:claimed:<T>  hash: replica -> digest of the ticks of second T it claimed first
//	                          (outside a Cluster; TTL 1 minute; see Followers)
//
// A file schedule stays in P{schedules}:file while a live replica declares
// it: a replica that leaves, or whose heartbeat expires, takes its
// declarations with it (replicas.lua), and one that registers removes the
// names that no live replica declares (register.lua), so a schedule removed
// from every replica's config leaves the listing.
//
// # Run-time schedules
//
// put.lua, remove.lua and pause.lua change a schedule, increment the version
// and publish it, atomically. Each replica reloads on a notice and checks the
// version every 500ms (resyncInterval) in case a notice was lost, then starts
// the loops of new or changed schedules and stops those of removed or paused
// ones. since, set by put.lua when the cron or time zone is new, is the
// effective watermark of a changed spec: no tick at or before it is due.
//
// # The tick claim
//
// One tick moves through these states; every arrow is one atomic script:
//
//	              claim.lua: T > watermark
//	              watermark := T, lease on T (p:T)
//	┌─────────┐ ─────────────────────────────────▶ ┌─────────┐  done.lua, after the  ┌──────┐
//	│ unknown │                                    │ claimed │ ────────────────────▶ │ done │
//	└─────────┘                                    └─────────┘  enqueue (or its task └──────┘
//	     │                                  lease    │   ▲      id existed already)
//	     │ skip.lua, or a later tick      ends       │   │ claim.lua: T pending,
//	     │ claimed (catch-up policy,                 ▼   │ lease over: a takeover
//	     │ a stall)                             ┌──────────┐
//	     ▼                                      │ orphaned │
//	┌─────────┐                                 └──────────┘
//	│ skipped │
//	└─────────┘
//
// skipped and done are final: T is at or behind the watermark and not
// pending, so claim.lua answers "done" to every later attempt.
//
// claim.lua answers, for a tick T:
//   - fresh: T was ahead of the watermark; it is now pending with this
//     attempt's lock, and the watermark is T. The caller enqueues.
//   - taken: T was pending and its lease was over (or was this attempt's);
//     the caller takes over and enqueues.
//   - held: another attempt's lease on T is live. The caller is a follower.
//   - done: T is at or behind the watermark and not pending: it was enqueued,
//     or dropped by the catch-up policy. Ticks never go backwards.
//   - early: T lies further ahead of Redis's clock than max_clock_skew + 1s.
//     The caller's clock is wrong; it does not claim.
//
// # Guarantees
//
//   - G1, at most once. A fresh claim happens once per tick because the
//     watermark only grows, atomically with the claim. A second winner
//     exists only after a leader held its tick past tick_lock_ttl (a stall);
//     both enqueue with the same task id and asynq keeps one, because the
//     task is retained for task_retention after it completes. A pending tick
//     is taken over only while it is younger than task_retention − 2 ×
//     max_clock_skew − tick_lock_ttl, so its first task id is still known.
//   - G2, at least once while a replica lives. A first claimer that dies
//     before its claim leaves the tick to the others, which claim it
//     claimGrace after T. A tick's leader that dies between claim and done
//     leaves the tick pending; each replica sweeps the pending sets of its
//     share every tick_lock_ttl/2 and takes over ticks whose lock expired,
//     within max(tick_lock_ttl, replicaExpiry) + tick_lock_ttl/2 of the
//     claim (the dead leader's share passes on when its heartbeat expires).
//   - Skewed clocks. Leases are measured by Redis (TIME), never by a
//     replica's clock. A replica's clock only decides when it tries a tick:
//     one that is ahead tries early, one that is behind finds the tick done.
//     A tick that nobody claimed within max_clock_skew + 1s of T is missed;
//     a replica whose clock is ahead of Redis's by more than that is refused.
//   - Catch-up. At start, and whenever a replica finds a tick later than
//     max_clock_skew + 1s (a stall, Redis down, a clock jump), it applies the
//     schedule's policy to the ticks between the watermark and now − (
//     max_clock_skew + 1s): skip enqueues none of them; once enqueues the
//     latest; all enqueues the latest max_catch_up. Dropped ticks are
//     skipped first (skip.lua moves the watermark to the last of them and
//     records them, reason paused for those due between the schedule's last
//     pause and resume, else catch_up) and counted as missed by the replica
//     that moved the watermark over them.
//     Ticks within max_clock_skew + 1s of now are treated as on time.
//
// # Not guaranteed
//
//   - A Redis restart that loses data (no persistence, or a failover to a
//     replica that had not received the last writes) loses the watermark and
//     the asynq task ids with the queue itself, and a replica whose clock is
//     behind may then enqueue a tick within max_clock_skew of the restart a
//     second time. Run Redis with AOF, as asynq needs for durable queues.
//   - Replicas whose clocks differ by more than max_clock_skew can make a
//     restarting replica treat a tick as missed while another is about to
//     claim it (G2 under skip and once); G1 holds regardless.
//   - A replica enqueues up to its clock's lead early.
//
// # Failure handling
//
//   - Leader dies after the claim, before the enqueue: the tick stays
//     pending; after tick_lock_ttl another replica's sweep takes it over.
//   - Leader dies after the enqueue, before done: the takeover's enqueue
//     meets the task id (counted "duplicate") and marks the tick done.
//   - Leader stalls past its lease and wakes: both enqueue, one task id wins.
//   - Redis unreachable at T: the claim is retried for max_clock_skew + 1s;
//     then the tick is left to the catch-up policy, which runs as soon as
//     Redis answers again. A claim that reached a stalled Redis may run only
//     when it wakes, after its sender gave up: the tick is then pending with
//     nobody enqueuing, and a sweep takes it over. An enqueue is retried for
//     the lease; then the tick is left pending for a takeover. A failed done
//     is finished by a takeover.
//   - All replicas down: on start, the catch-up policy decides about the
//     ticks nobody claimed.
//   - Clock steps back: ticks at or behind the watermark are done; the
//     schedule waits for its next tick. Clock steps forward: the ticks
//     skipped over are late and go to the catch-up policy.
//
// # Redis calls
//
// A winning replica makes three calls per tick (claim, enqueue, done); a
// follower, outside a Cluster, one read per first claimer and second
// (Followers), in a Cluster one check per tick, claimGrace after T. The
// claims (and dones) of one replica that are due together (every schedule
// firing in the same second) are merged into one claim.lua (done.lua) call
// per Cluster slot, one per node outside a Cluster; asynq's enqueue
// scripts and the other script calls go out in the same pipeline of
// EVALSHA. Woken by a call while idle, the runner waits a millisecond for
// the calls that follow (thousands of goroutines waking at the same second
// reach it over some milliseconds). The calls that meet NOSCRIPT are sent
// again once their scripts are loaded (script.RunPipelined); the others are
// not repeated. Per tick, inside those calls: the claim reads state and
// writes it once (watermark, leader and lease in one HSET); the done deletes
// the lease field and pushes the history record (trimmed when it holds twice
// historyLen records); TTLs are set once a day.
//
// # First claimers
//
// Replicas heartbeat every 500ms (replicas.lua) and read the live set; a
// schedule's first claimer is the live replica with the highest rendezvous
// hash of (replica, schedule). Views that differ briefly give a tick two
// first claimers (one wins) or none (the others claim after the grace). A
// replica sweeps pending ticks only of its own share, so a dead replica's
// pending ticks are swept by the new owners once its heartbeat expires
// (replicaExpiry), and its unclaimed ticks are claimed after the grace.
// Between full sweeps (every 20th) a replica reads only the schedules with a
// recent tick that it did not see done itself (it was a follower, or its
// done failed): a tick that this replica claimed, enqueued and marked done
// cannot be orphaned. Every retry is bounded: a claim by max_clock_skew +
// 1s, an enqueue and a done by tick_lock_ttl.
//
// # Followers
//
// Outside a Cluster, a first claimer's claim call also adds, for each second
// T, the digests of the schedules it claimed (a 48-bit hash of each name,
// summed modulo 2^48) to P{schedules}:claimed:<T>. A follower computes, once
// per second, the sum it expects from each first claimer (the schedules due
// at T that its view of the live set gives to that replica) and reads the
// digests in one pipeline, again claimGrace apart while one differs (a first
// claimer still claiming; up to followReads times, twice when it is
// missing: a first claimer that is dead or does not run them). Equal,
// every one of those ticks is at or behind its watermark, which is all a
// follower's per-tick check would learn. Different (views of the live set or
// of the schedules that differ, a first claimer that is dead or slow, a
// retried claim counted twice), the follower checks each of its ticks and
// claims the ones nobody claimed. G1 does not depend on this read; G2 does,
// up to a collision: two different sets of schedules have the same sum with
// probability 2^-48.
//
// # Overlap and backfill
//
// A schedule whose overlap policy is not allow has its runs kept by
// internal/overlap: the tick's winner, after the claim and before the
// enqueue, calls overlap.Tick once (P{schedule:N}:runs, asynq's state of
// each run, the run lock P{schedule:N}); a skipped tick is marked done with
// a skipped record (reason overlap), and its task carries the headers that
// make the worker hold the run lock. A failed check leaves the tick pending
// for a takeover, which decides again (a run it registered counts as its
// own). Store.Backfill enqueues past ticks at or before the watermark (or a
// run-time spec's since), which no replica claims any more, under the same
// check; their task ids, kept for task_retention, make a tick enqueued
// before (by a replica or another backfill) collapse into its task, so a
// range older than task_retention is refused.
//
// # Time zones
//
// Schedules run in their time zone (default UTC; a CRON_TZ= prefix in the
// expression overrides it). Schedules with a fixed hour field fire once per
// wall-clock time across daylight-saving changes: a tick in the skipped hour
// fires at the first instant after it, and a repeated hour fires only in its
// first pass; schedules whose hour field is * or */n follow elapsed time.
// "@every D" ticks at multiples of D since the Unix epoch, so that all
// replicas agree whenever they started.
//
// # Metrics
//
// lockstep_scheduler_ticks_total{schedule,result} with result enqueued,
// follower, duplicate, missed, caught_up, skipped_overlap or backfilled (a
// backfill counts its ticks in the schedule's state; the replica that
// sweeps the schedule takes that count, ResultBackfilled);
// lockstep_scheduler_tick_lateness_seconds
// (enqueue time − T, for ticks enqueued on time or by takeover);
// lockstep_scheduler_ticks_missed_total; lockstep_scheduler_leader_changes_total,
// counted by the replica that wins a tick after another replica won the one
// before, so the sum over replicas is the number of changes.
package scheduler
