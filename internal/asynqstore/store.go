// Package asynqstore is the only code in Lockstep that knows asynq's
// private Redis layout, scripts and timings, as asynq v0.26.0 has them
// (internal/base, internal/rdb and the processor there): the task hash (its
// state and protobuf message), the pending and active lists, the lease,
// retry and completed sets, the processed counters and uniqueness locks,
// the EVALSHA calls of its client and server, its lease and recoverer
// periods and its whole-second retry scores. Everywhere else Lockstep uses
// asynq's public API only.
//
// Its operations, each for one user:
//   - enqueue: PipelineEnqueues (enqueue.go) lets the scheduler's replicas
//     pipeline asynq's enqueues with their own script calls;
//   - dequeue: RecordDequeues (dequeue.go) records each task for the job
//     server's recovery as asynq hands it over, and notes in the task
//     which worker took it;
//   - park: RetryDelay (timing.go) is the delay that keeps a task parked in
//     asynq's retry set for at least as long as asked;
//   - wake: Wake brings a parked task back at once;
//   - claim, extend, complete: Claim and ExtendClaim let a hand-off chain
//     run a parked task under its lease and complete it as asynq's Done
//     does;
//   - recover: Recover and RecoverActive bring a dead worker's task back,
//     and Holds tells whether asynq has recorded a task's result yet and
//     may still deliver it;
//   - decode: DecodeTaskMsg (taskmsg.go) reads a task's message, and
//     TaskMsg.Context bounds its run as asynq does; Redelivery bounds
//     asynq's own redelivery of a dead worker's task.
//
// A binary linked against another asynq version does not use it: Supported
// says so, and the job server then requeues contended tasks with its
// backoff instead of writing a layout it does not know. The contract test
// (contract_test.go) runs each operation on tasks of asynq's own client and
// server and checks what asynq's own Inspector reports; it fails when
// asynq's layout changes, and when go.mod requires another asynq than
// Version.
package asynqstore

import (
	"context"
	_ "embed"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lockstep-dev/lockstep/internal/script"
)

// Version is the asynq release whose layout this package writes.
const Version = "v0.26.0"

// asynqModule is asynq's module path.
const asynqModule = "github.com/hibiken/asynq"

// Supported returns the asynq version linked into this binary and whether
// it is Version. A binary whose build information lists no dependencies at
// all (go test's binaries) was built from this module's own go.mod, which
// requires Version.
func Supported() (linked string, ok bool) {
	info, found := debug.ReadBuildInfo()
	if !found {
		return "", false
	}
	return versionIn(info)
}

func versionIn(info *debug.BuildInfo) (string, bool) {
	if len(info.Deps) == 0 {
		return Version, true
	}
	for _, m := range info.Deps {
		if m.Path == asynqModule {
			if m.Replace != nil {
				return m.Replace.Version, m.Replace.Version == Version
			}
			return m.Version, m.Version == Version
		}
	}
	return "", false // linked without asynq: nothing to hand off
}

var (
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/wake.lua
	wakeLua string
	//go:embed lua/recover.lua
	recoverLua string

	scriptClaim   = script.New("asynqstore/claim.lua", claimLua)
	scriptWake    = script.New("asynqstore/wake.lua", wakeLua)
	scriptRecover = script.New("asynqstore/recover.lua", recoverLua)
)

// Store reads and writes asynq's tasks in its Redis.
type Store struct{ client redis.UniversalClient }

// New returns a Store over client, the Redis of asynq's queues.
func New(client redis.UniversalClient) *Store { return &Store{client: client} }

func queuePrefix(queue string) string { return "asynq:{" + queue + "}:" }

// Woken is what Wake found.
type Woken int

// Wake's answers.
const (
	WokenNot    Woken = 0  // done, pending or grouped: nothing changed
	WokenMoved  Woken = 1  // moved from the retry set to the head of its queue
	WokenActive Woken = -1 // still active: on its way to the retry set, or running
	WokenGone   Woken = 2  // asynq has no such task
)

// Wake offers the task id of queue again now, instead of at its retry time:
// it moves the task from asynq's retry set to the head of its queue, as
// asynq's forwarder does once the retry time has come. Only a task in the
// retry state moves, so a task that completed, was archived or runs is
// never run again by a wake.
func (s *Store) Wake(ctx context.Context, queue, id string) (Woken, error) {
	return s.wake(ctx, queue, id, "")
}

// WakeLast is Wake to the end of the task's queue, behind every pending
// task, where asynq's enqueue puts a task: so tasks woken one after the
// other are dequeued in that order.
func (s *Store) WakeLast(ctx context.Context, queue, id string) (Woken, error) {
	return s.wake(ctx, queue, id, "last")
}

func (s *Store) wake(ctx context.Context, queue, id, where string) (Woken, error) {
	p := queuePrefix(queue)
	v, err := script.Run(ctx, s.client, scriptWake, "asynq wake", []string{p + "t:" + id, p + "retry", p + "pending"},
		id, time.Now().UnixNano(), where)
	n, _ := v.(int64)
	return Woken(n), err
}

// Finished is a task that a chain ran and that asynq still lists: Claim
// completes it as asynq's Done does.
type Finished struct {
	Queue, ID string
	Unique    string // its unique key, "" when it has none
	// Retention, when not 0, keeps it completed that long (asynq.Retention):
	// Msg is then its encoded message, which gets its completion time.
	Retention time.Duration
	Msg       []byte
}

// Claimed is what Claim found of the next task.
type Claimed int

// Claim's answers about the next task.
const (
	ClaimedNot     Claimed = 0  // gone, done or grouped: not ours to run
	ClaimedOK      Claimed = 1  // claimed: its message is returned
	ClaimedActive  Claimed = -1 // still active: on its way to the retry set
	ClaimedPending Claimed = 2  // pending: on its way to a worker, which takes the lock
)

// Claim completes done (if not nil) and claims the task id of queue (if id
// is not "") in one call (claim.lua): a claimed task stays in the retry set
// with its score pushed to lease, so that a chain that dies leaves it to
// asynq's own forwarder once the lease passes. done and the next task must
// share queue. It reports whether done was completed (false: it was no
// longer the chain's), and the next task's encoded message when claimed.
func (s *Store) Claim(ctx context.Context, done *Finished, queue, id string, lease time.Time) (completed bool, c Claimed, msg []byte, err error) {
	if done != nil {
		queue = done.Queue
	}
	p := queuePrefix(queue)
	now := time.Now()
	keys := []string{p + "retry", p + "t:", p + "processed:" + now.UTC().Format("2006-01-02"), p + "processed", p + "unique:", p + "t:", p + "completed"}
	args := []any{"", now.Add(90 * 24 * time.Hour).Unix(), "", "", lease.Unix() + 1, "", ""}
	if done != nil {
		keys[1], args[0] = p+"t:"+done.ID, done.ID
		if done.Unique != "" {
			keys[4], args[2] = done.Unique, "1"
		}
		if done.Retention > 0 {
			args[5], args[6] = now.Add(done.Retention).Unix(), completedAt(done.Msg, now)
		}
	}
	if id != "" {
		keys[5], args[3] = p+"t:"+id, id
	}
	v, err := script.Run(ctx, s.client, scriptClaim, "asynq claim", keys, args...)
	if err != nil {
		return false, 0, nil, err
	}
	vals, _ := v.([]any)
	if len(vals) < 2 {
		return false, 0, nil, fmt.Errorf("asynq claim: unexpected reply %v", v)
	}
	n, _ := vals[1].(int64)
	if len(vals) > 2 {
		m, _ := vals[2].(string)
		msg = []byte(m)
	}
	return vals[0] == int64(1), Claimed(n), msg, nil
}

// ExtendClaim pushes a claimed task's lease (its retry score) to until.
func (s *Store) ExtendClaim(ctx context.Context, queue, id string, until time.Time) error {
	return s.client.ZAddXX(ctx, queuePrefix(queue)+"retry", redis.Z{Score: float64(until.Unix() + 1), Member: id}).Err()
}

// Recover brings the task id of queue back now, to the head of its queue,
// when it is active in the hands of process (dead: it died running it) or
// claimed by a chain in the retry set, and returns its message; nil when it
// left the task alone. An active task whose last dequeue (RecordDequeues)
// was another process's is that process's, and is left alone; one no such
// dequeue delivered (an older worker's) is not checked so.
// Its retry count is left as it is: a crash is not the task's failure.
func (s *Store) Recover(ctx context.Context, queue, id, process string) (*TaskMsg, error) {
	return s.recover(ctx, queue, id, process, "")
}

// RecoverActive is Recover for a task its dead worker held no lock for: it
// is brought back only while it is active; in the retry set, asynq has it
// again.
func (s *Store) RecoverActive(ctx context.Context, queue, id, process string) (*TaskMsg, error) {
	return s.recover(ctx, queue, id, process, "active")
}

func (s *Store) recover(ctx context.Context, queue, id, process, only string) (*TaskMsg, error) {
	p := queuePrefix(queue)
	v, err := script.Run(ctx, s.client, scriptRecover, "asynq recover",
		[]string{p + "t:" + id, p + "active", p + "lease", p + "retry", p + "pending"}, id, time.Now().UnixNano(), only, process)
	m, ok := v.(string)
	if err != nil || !ok {
		return nil, err
	}
	msg, err := DecodeTaskMsg([]byte(m))
	return &msg, err
}

// Task names one task of asynq's.
type Task struct{ Queue, ID string }

// Held says what asynq still does with a task that left a worker's hands.
type Held struct {
	// Active: asynq has not recorded the handler's result yet (it retries
	// that while Redis is away).
	Active bool
	// Deliverable: asynq may still deliver it (pending, active, scheduled,
	// retry or aggregating); not when it is completed, archived or gone.
	Deliverable bool
	// Lease: an active task's lease deadline (whole seconds; zero when it
	// has none). A delivery sets it Lease (the duration) ahead and its
	// server's heartbeat pushes it on while the handler runs: one further
	// ahead than that from when the task left a worker's hands is another
	// delivery's.
	Lease time.Time
	// By: the process whose dequeue (RecordDequeues) delivered an active
	// task; "" when none such did.
	By string
}

// Holds reports, for each task, what asynq still does with it (its task
// hash's state and its lease). One round trip.
func (s *Store) Holds(ctx context.Context, tasks []Task) ([]Held, error) {
	cmds := make([]*redis.SliceCmd, len(tasks))
	leases := make([]*redis.FloatCmd, len(tasks))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range tasks {
			cmds[i] = p.HMGet(ctx, queuePrefix(t.Queue)+"t:"+t.ID, "state", workerField)
			leases[i] = p.ZScore(ctx, queuePrefix(t.Queue)+"lease", t.ID)
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("asynq task states: %w", err)
	}
	out := make([]Held, len(tasks))
	for i, c := range cmds {
		var state, by string
		if v := c.Val(); len(v) == 2 {
			state, _ = v[0].(string)
			by, _ = v[1].(string)
		}
		switch state {
		case "active":
			out[i] = Held{Active: true, Deliverable: true, By: by}
			if sec, err := leases[i].Result(); err == nil {
				out[i].Lease = time.Unix(int64(sec), 0)
			}
		case "pending", "scheduled", "retry", "aggregating":
			out[i] = Held{Deliverable: true}
		}
	}
	return out, nil
}

// workerField is the task hash's field in which a dequeue through
// RecordDequeues writes the worker's process (lua/dequeue.lua): asynq reads
// only the fields it knows, and deletes the field with the task.
const workerField = "lockstep:worker"

// completedAtField is TaskMessage's completed_at (asynq's internal/proto).
const completedAtField = 13

// completedAt returns msg with its completion time set to now, as asynq's
// MarkAsComplete writes it: a scalar field appended to a protobuf message
// overrides any earlier value of it.
func completedAt(msg []byte, now time.Time) []byte {
	out := protowire.AppendTag(append([]byte(nil), msg...), completedAtField, protowire.VarintType)
	return protowire.AppendVarint(out, uint64(now.Unix()))
}
