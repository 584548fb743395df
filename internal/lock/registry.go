package lock

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Registry is one job server process's part in recovery (see HoldRecord
// above): its hold records, its beats, the other processes' records it
// judges, and the done markers of the tasks it ran; and the record of its
// lost locks (RecordLoss). It is the only writer
// and reader of those keys; a job server sends no command of its own on
// them. Its commands go to client, the Redis that holds the job queues:
// on Redis the lock's own, on the back ends whose locks live elsewhere
// (Redlock, etcd) the one beside the queue. The keys are the Locker's.
type Registry struct {
	l       *Locker
	c       redis.UniversalClient
	process string // this process (host:pid)
	holds   string // its holds set
}

// Registry returns process's registry on client (see Registry).
func (l *Locker) Registry(client redis.UniversalClient, process string) *Registry {
	return &Registry{l: l, c: client, process: process, holds: l.HoldsKey(process)}
}

// Process is the process the registry records for (host:pid).
func (r *Registry) Process() string { return r.process }

// Holds is this process's holds set, for the scripts that record a task in
// the same step as they take its lock or deliver it (Take, HandOn, asynq's
// dequeue: asynqstore.RecordDequeues).
func (r *Registry) Holds() string { return r.holds }

// Record adds rec (HoldRecord) to this process's holds.
func (r *Registry) Record(ctx context.Context, rec string) error {
	return r.c.SAdd(ctx, r.holds, rec).Err()
}

// Swap replaces the record from with to in one step: a recoverer sees one
// or the other, never neither.
func (r *Registry) Swap(ctx context.Context, from, to string) error {
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, r.holds, to)
		p.SRem(ctx, r.holds, from)
		return nil
	})
	return err
}

// Drop removes rec from this process's holds.
func (r *Registry) Drop(ctx context.Context, rec string) error {
	return r.c.SRem(ctx, r.holds, rec).Err()
}

// Beat says this process is alive until until: a command of its own, which
// nothing else delays or fails (what a beat settles lies, on a Cluster, on
// other masters).
func (r *Registry) Beat(ctx context.Context, until time.Time) error {
	return r.c.ZAdd(ctx, r.l.ProcessesKey(), redis.Z{Score: float64(until.UnixMilli()), Member: r.process}).Err()
}

// Remove removes the records done from this process's holds and deletes
// the done markers drop, in one round trip (one DEL each: on a Cluster they
// lie in their resources' slots).
func (r *Registry) Remove(ctx context.Context, done []string, drop []string) error {
	if len(done)+len(drop) == 0 {
		return nil
	}
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(done) > 0 {
			recs := make([]any, len(done))
			for i, d := range done {
				recs[i] = d
			}
			p.SRem(ctx, r.holds, recs...)
		}
		for _, m := range drop {
			p.Del(ctx, m)
		}
		return nil
	})
	return err
}

// Leave ends this process's part at a graceful stop: its holds and its
// beat go.
func (r *Registry) Leave(ctx context.Context) error {
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, r.holds)
		p.ZRem(ctx, r.l.ProcessesKey(), r.process)
		return nil
	})
	return err
}

// Overdue returns up to n processes whose last beat said they would be
// alive no longer than now.
func (r *Registry) Overdue(ctx context.Context, now time.Time, n int64) ([]string, error) {
	return r.c.ZRangeByScore(ctx, r.l.ProcessesKey(), &redis.ZRangeBy{Min: "-inf", Max: ms(now), Count: n}).Result()
}

// Live returns the processes whose last beat says they are alive after now.
func (r *Registry) Live(ctx context.Context, now time.Time) ([]string, error) {
	return r.c.ZRangeByScore(ctx, r.l.ProcessesKey(), &redis.ZRangeBy{Min: "(" + ms(now), Max: "+inf"}).Result()
}

// IsOverdue reports whether process p's last beat is over by now (false when
// it has none).
func (r *Registry) IsOverdue(ctx context.Context, p string, now time.Time) (bool, error) {
	score, err := r.c.ZScore(ctx, r.l.ProcessesKey(), p).Result()
	if err != nil {
		return false, err
	}
	return score <= float64(now.UnixMilli()), nil
}

// Records returns process p's hold records.
func (r *Registry) Records(ctx context.Context, p string) ([]string, error) {
	return r.c.SMembers(ctx, r.l.HoldsKey(p)).Result()
}

// Claim takes rec out of process p's holds, reporting whether this call
// removed it: exactly one recoverer wins a record.
func (r *Registry) Claim(ctx context.Context, p, rec string) (bool, error) {
	n, err := r.c.SRem(ctx, r.l.HoldsKey(p), rec).Result()
	return n > 0, err
}

// Forget removes process p from the processes if its beat is still over by
// now (a paused process that resumed beat again meanwhile and stays).
func (r *Registry) Forget(ctx context.Context, p string, now time.Time) error {
	overdue, err := r.IsOverdue(ctx, p, now)
	if err != nil || !overdue {
		return err
	}
	return r.c.ZRem(ctx, r.l.ProcessesKey(), p).Err()
}

// MarkDone leaves the done marker of the task id of queue on resource with
// outcome, for ttl: a delivery of the task that finds it does not run it
// again (G8).
func (r *Registry) MarkDone(ctx context.Context, resource, queue, id, outcome string, ttl time.Duration) error {
	return r.c.Set(ctx, r.l.DoneKey(resource, queue, id), outcome, ttl).Err()
}

// Outcome returns the outcome the done marker of the task id of queue on
// resource holds ("" when there is none).
func (r *Registry) Outcome(ctx context.Context, resource, queue, id string) (string, error) {
	v, err := r.c.Get(ctx, r.l.DoneKey(resource, queue, id)).Result()
	if err == redis.Nil {
		return "", nil
	}
	return v, err
}

// KeepMarker gives the done marker (DoneKey) ttl more.
func (r *Registry) KeepMarker(ctx context.Context, marker string, ttl time.Duration) error {
	return r.c.PExpire(ctx, marker, ttl).Err()
}

// DropMarker deletes the done marker (DoneKey): no delivery of its task is
// left to read it.
func (r *Registry) DropMarker(ctx context.Context, marker string) error {
	return r.c.Del(ctx, marker).Err()
}

// Lost locks are also recorded in a short stream (LossesKey), so that an
// operator sees the recent ones with their reason (lockstep ui) without a
// log search: entries with resource, reason, fence, permit, holder,
// task_id, type, queue and at_ms.
const (
	lossesLen     = 1000            // entries kept, approximately
	lossesTimeout = 1 * time.Second // a loss because Redis is unreachable must not hold the task long
)

// RecordLoss adds lost, the loss of lease held for the task id of queue (of
// type typ), to the losses stream: best effort, within lossesTimeout.
func (r *Registry) RecordLoss(ctx context.Context, lease *Lease, lost *LostError, typ, queue, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lossesTimeout)
	defer cancel()
	return r.c.XAdd(ctx, &redis.XAddArgs{
		Stream: r.l.LossesKey(), MaxLen: lossesLen, Approx: true,
		Values: []any{"resource", lease.resource, "reason", string(lost.Reason), "fence", lease.fence, "permit", lease.Permit(),
			"holder", ParseToken(lease.token).Holder, "task_id", id, "type", typ,
			"queue", queue, "at_ms", strconv.FormatInt(time.Now().UnixMilli(), 10)},
	}).Err()
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
