package chaos

import (
	"slices"
	"time"
)

// History is everything a run recorded, in the form the checker reads. The
// harness fills it from Redis, asynq and the replicas' logs; tests build one
// by hand.
type History struct {
	Seed       uint64
	Start, End time.Time
	// Lock is the workers' lock back end, "redis" or "etcd". With etcd, a
	// Redis fault excuses no overlap: the locks do not live there.
	Lock string
	// LockTTL is the workers' lock TTL (recovery_ms's bound).
	LockTTL time.Duration
	// Store is the demo's fenced store, "redis" or "postgres" (where Writes
	// are the rows of its log table).
	Store string
	// Redis is the deployment the queue and the Redis locks live on:
	// "single" (one AOF server) or "cluster" (3 masters, a replica each).
	Redis string

	// Executions is the demo's executions stream, in stream order.
	Executions []Execution
	// ExecutionsComplete is false when the stream was trimmed (or could not
	// be read in full): checks on it are then incomplete.
	ExecutionsComplete bool

	// Writes is the demo store's log of accepted fenced writes, in the
	// store's (that is, real) order: its streams' order on Redis, its table's
	// ids on PostgreSQL; nil with WritesAvailable false when the demo keeps
	// no such log.
	Writes          []Write
	WritesAvailable bool
	WritesComplete  bool

	// RatedStarts are the starts of the rate-limited demo job
	// (demo:api.call), each with its admission; RatedComplete is false when
	// its stream was trimmed or could not be read in full.
	RatedStarts   []RatedStart
	RatedComplete bool

	// Jobs are the jobs the producer enqueued, with asynq's final state.
	Jobs []Job

	// Claims and Enqueues are the scheduler replicas' own records of the
	// ticks they claimed and enqueued, from their log lines.
	Claims   []TickEvent
	Enqueues []TickEvent
	// Skips are the ticks a replica won and skipped by the schedule's
	// overlap policy ("tick skipped"): recorded, not missing.
	Skips []TickEvent
	// Ticks are the ticks every schedule was due to fire in the checked
	// window, each with its asynq task state ("" when asynq has no task).
	Ticks []Tick
	// ReplicaLogsComplete is false when a replica's log could not be read.
	ReplicaLogsComplete bool

	// Faults are the faults injected, in order.
	Faults []Fault

	// CompletionsNotRecorded are, by task id, the times a worker logged
	// that asynq could not record the task's completion (Redis down or
	// loading when the handler returned): asynq then delivers the task
	// again once its lease passes, its at-least-once, as after a kill.
	CompletionsNotRecorded map[string][]time.Time

	// Recoveries are the tasks a worker logged it brought back from a
	// worker it judged dead ("dead worker's task recovered").
	Recoveries []Recovery
}

// Recovery is one task a worker brought back from a worker it judged dead.
type Recovery struct {
	At     time.Time
	TaskID string
	Dead   string // the worker judged dead (host:pid)
}

// Execution is one entry of the demo's executions stream.
type Execution struct {
	OrderID  string // "" for a tenant's sync (demo:tenant.sync)
	TenantID string // a tenant's sync: its tenant and permit
	Permit   int
	Fence    int64
	Worker   string // host:pid of the worker process
	TaskID   string
	Started  time.Time
	Finished time.Time
	Outcome  string // ok, lock_lost, fence_rejected, canceled
}

// RatedStart is one start of a rate-limited job: its key's client, and
// when its rate admitted it (Redis's clock; zero: no admission) and it
// started (the worker's clock, the same machine's).
type RatedStart struct {
	Client   string
	TaskID   string
	Worker   string
	Admitted time.Time
	Started  time.Time
}

// Write is one accepted write of the demo's fenced store.
type Write struct {
	OrderID string
	Fence   int64
	TaskID  string
	Worker  string
	Op      string // begin or commit
	At      time.Time
}

// Job is one job the producer enqueued.
type Job struct {
	ID      string
	OrderID string
	// Acked is true when asynq acknowledged the enqueue; an enqueue that
	// failed or timed out may or may not have happened, and is not checked.
	Acked bool
	// State is asynq's final state (completed, archived, pending, active,
	// retry, scheduled), or "" when asynq has no such task.
	State string
}

// TickEvent is one replica's log line for a tick.
type TickEvent struct {
	Replica  string
	Schedule string
	Tick     int64 // Unix seconds
	Kind     string
	Result   string // enqueues only: enqueued, caught_up, duplicate
	At       time.Time
}

// Tick is one tick of a schedule that was due within the checked window.
type Tick struct {
	Schedule string
	Tick     int64
	State    string // asynq task state, "" when there is no task
}

// Fault is one injected fault.
type Fault struct {
	Kind   string
	Target string    // e.g. worker-2, scheduler-1, redis
	PID    int       // the process that received the signal, if any
	Worker string    // the demo's worker id of that process (host:pid), for workers
	Start  time.Time // when the fault began
	End    time.Time // when it was healed (process restarted, resumed, link restored)
	Detail string    // e.g. "paused 3.2s", "killed 140ms into a tick"
	// Holds: a worker_kill's killed worker's hold records right after the
	// kill (a worker_kill_drain's once the process has exited), the tasks
	// its recovery knows of (task ids; "" when not read).
	Holds []string
	// Active: the tasks active in asynq right after a worker_kill's kill
	// (a worker_kill_drain's exit; its Inspector; nil when not read): a
	// task the worker had begun and not ended is in its hands only if
	// asynq still has it active.
	Active []string
	// Resources: a Cluster master's fault's, what the demo's runs are
	// checked on (runKey: an order, a tenant's permit) whose locks that
	// master served when the fault began.
	Resources []string
	// Promoted: when the faulted master's replica said it was master (zero:
	// it did not take over).
	Promoted time.Time
}

// Fault kinds.
const (
	FaultWorkerKill       = "worker_kill"        // SIGKILL mid-work, restart
	FaultWorkerKillDrain  = "worker_kill_drain"  // SIGTERM, SIGKILL during the drain, restart
	FaultSchedulerKill    = "scheduler_kill"     // SIGKILL at a random offset inside a tick, restart
	FaultWorkerPauseShort = "worker_pause_short" // SIGSTOP for less than the lock TTL
	FaultWorkerPauseLong  = "worker_pause_long"  // SIGSTOP for more than the lock TTL
	FaultRedisPauseShort  = "redis_pause_short"  // SIGSTOP Redis for less than the lock TTL
	FaultRedisPauseLong   = "redis_pause_long"   // SIGSTOP Redis for more than the lock TTL
	FaultRedisKill        = "redis_kill_aof"     // SIGKILL Redis, restart from its AOF
	FaultWorkerPartition  = "worker_blackhole"   // a worker's link to Redis black-holed, then healed

	// With the etcd lock back end (Config.Lock "etcd"): one member of the
	// 3-member etcd cluster that holds the locks is stopped or killed.
	FaultEtcdLeaderPause = "etcd_leader_pause" // SIGSTOP the etcd leader, then SIGCONT
	FaultEtcdMemberKill  = "etcd_member_kill"  // SIGKILL an etcd member, restart it with its data
)

// EtcdFaults are the fault kinds of the etcd mode only.
var EtcdFaults = []string{FaultEtcdLeaderPause, FaultEtcdMemberKill}

// With Config.Redis "cluster" (3 masters, a replica each, cluster-node-timeout
// 1 s), faults of the Cluster's nodes replace those of the one Redis.
const (
	// SIGKILL a master; the Cluster marks it failed and promotes its
	// replica; the killed node is restarted (empty) and rejoins as a replica.
	FaultClusterMasterKill = "cluster_master_kill"
	// SIGSTOP a master for less than the node timeout, then SIGCONT.
	FaultClusterMasterPauseShort = "cluster_master_pause_short"
	// SIGSTOP a master past the node timeout: its replica is promoted while
	// it is stopped; on SIGCONT it learns so and rejoins as a replica.
	FaultClusterMasterPauseLong = "cluster_master_pause_long"
	// SIGKILL a replica, restart it (empty): it resyncs from its master.
	FaultClusterReplicaKill = "cluster_replica_kill"
)

// ClusterFaults are the fault kinds of the Cluster mode only; with them the
// single server's (redis_*) and worker_blackhole (a proxy cannot stand
// between a Cluster client and the nodes it discovers) are not drawn.
var ClusterFaults = []string{FaultClusterMasterKill, FaultClusterMasterPauseShort, FaultClusterMasterPauseLong, FaultClusterReplicaKill}

// faultKinds lists every fault kind of every mode, in a fixed order.
var faultKinds = slices.Concat(AllFaults, EtcdFaults, ClusterFaults)

// failover reports whether kind can make a Cluster master's replica take
// over: a lock the master had not yet replicated can be lost (DESIGN §1).
func failover(kind string) bool {
	return kind == FaultClusterMasterKill || kind == FaultClusterMasterPauseLong
}

// AllFaults lists every fault kind in a fixed order.
var AllFaults = []string{
	FaultWorkerKill, FaultWorkerKillDrain, FaultSchedulerKill,
	FaultWorkerPauseShort, FaultWorkerPauseLong,
	FaultRedisPauseShort, FaultRedisPauseLong, FaultRedisKill,
	FaultWorkerPartition,
}

// redisFault reports whether kind makes Redis itself unhealthy without a
// failover: the single server paused or killed, a Cluster master paused
// for less than the node timeout.
func redisFault(kind string) bool {
	return kind == FaultRedisPauseShort || kind == FaultRedisPauseLong || kind == FaultRedisKill ||
		kind == FaultClusterMasterPauseShort
}

// workerKill reports whether kind kills a worker process.
func workerKill(kind string) bool {
	return kind == FaultWorkerKill || kind == FaultWorkerKillDrain
}
