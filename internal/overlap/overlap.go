package overlap

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/script"
)

// Task headers the scheduler sets on a tick's task of a schedule with a
// policy other than allow. The prefix keeps them apart from other headers
// (trace context).
const (
	HeaderSchedule = "lockstep-schedule"         // the schedule's name
	HeaderPolicy   = "lockstep-schedule-overlap" // its policy
)

var (
	//go:embed lua/tick.lua
	tickLua string
	//go:embed lua/start.lua
	startLua string
	//go:embed lua/finish.lua
	finishLua string

	scriptTick   = redis.NewScript(tickLua)
	scriptStart  = redis.NewScript(startLua)
	scriptFinish = redis.NewScript(finishLua)
)

// Keys are a schedule's keys for its runs.
type Keys struct {
	Runs     string // hash: task id -> "q <ms>", "q" or "r"
	Resource string // the run lock's resource (internal/lock)
	Lock     string // the run lock's key
}

// KeysFor returns schedule's keys under prefix (lock.prefix).
func KeysFor(prefix, schedule string) Keys {
	res, key := lock.ScheduleRun(prefix, schedule)
	return Keys{Runs: prefix + "{schedule:" + schedule + "}:runs", Resource: res, Lock: key}
}

// Headers returns the task headers of a run of schedule under policy, nil
// for allow (such a run takes no run lock).
func Headers(schedule string, policy config.Overlap) map[string]string {
	if policy == config.OverlapAllow || policy == "" {
		return nil
	}
	return map[string]string{HeaderSchedule: schedule, HeaderPolicy: string(policy)}
}

// WithHeaders adds Headers(schedule, policy) to h (a task's other headers,
// its trace context) and returns it; h may be nil.
func WithHeaders(h map[string]string, schedule string, policy config.Overlap) map[string]string {
	for k, v := range Headers(schedule, policy) {
		if h == nil {
			h = map[string]string{}
		}
		h[k] = v
	}
	return h
}

// Decision is the outcome of Tick.
type Decision struct {
	Run       bool // the run is registered: enqueue it; false: skip the tick
	Queued    int  // live runs queued, besides the new one
	Running   int  // live runs running
	Cancelled int  // cancel_previous: live runs ended for the new one
}

// Tick decides whether schedule's new run, task id in queue, may be
// enqueued under policy (not allow), and registers it if so. grace is how
// long a registered run that asynq does not know may still be being
// enqueued (the tick lease); ttl is the life of the runs hash after its
// last registration.
func Tick(ctx context.Context, c redis.UniversalClient, insp *asynq.Inspector, k Keys, state string,
	policy config.Overlap, queue, id string, grace, ttl time.Duration) (Decision, error) {
	runs, err := c.HKeys(ctx, k.Runs).Result()
	if err != nil {
		return Decision{}, fmt.Errorf("overlap: runs of %s: %w", id, err)
	}
	args := []any{string(policy), id, grace.Milliseconds(), ttl.Milliseconds()}
	for _, run := range runs {
		if run == id {
			continue
		}
		st, err := taskState(ctx, insp, queue, run)
		if err != nil {
			return Decision{}, err
		}
		args = append(args, run, st)
	}
	res, err := script.Run(ctx, c, scriptTick, "overlap tick", []string{k.Runs, state, k.Lock}, args...)
	if err != nil {
		return Decision{}, err
	}
	a, ok := res.([]any)
	if !ok || len(a) != 4 {
		return Decision{}, fmt.Errorf("overlap tick: unexpected reply %v", res)
	}
	n := func(i int) int { v, _ := a[i].(int64); return int(v) }
	return Decision{Run: n(0) == 1, Queued: n(1), Running: n(2), Cancelled: n(3)}, nil
}

// taskState is asynq's state of task id ("pending", "active", ...), "" if
// asynq does not know it.
func taskState(ctx context.Context, insp *asynq.Inspector, queue, id string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	info, err := insp.GetTaskInfo(queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("overlap: state of task %s: %w", id, err)
	}
	return info.State.String(), nil
}

// ErrEnded is Begin's error for a task whose run has ended: a later tick
// cancelled it (cancel_previous) or found it ended. The task is not run.
var ErrEnded = errors.New("overlap: the run has ended (a later tick superseded it); not run")

// Run is a run that holds its schedule's run lock.
type Run struct {
	client redis.UniversalClient
	keys   Keys
	id     string
	Lease  *lock.Lease
}

// Begin takes schedule's run lock for task id, waiting in line while
// another run holds it, and marks the run running. It returns ErrEnded
// (having released the lock) if the run has ended meanwhile.
func Begin(ctx context.Context, c redis.UniversalClient, l *lock.Locker, k Keys, id string, ttl time.Duration) (*Run, error) {
	live, err := c.HExists(ctx, k.Runs, id).Result()
	if err != nil {
		return nil, fmt.Errorf("overlap: run %s: %w", id, err)
	}
	if !live { // ended before it started: do not wait for the lock
		return nil, ErrEnded
	}
	lease, err := l.Acquire(ctx, k.Resource, ttl)
	if err != nil {
		return nil, err
	}
	res, err := script.Run(ctx, c, scriptStart, "overlap start", []string{k.Runs}, id)
	if err == nil && res == int64(1) {
		return &Run{client: c, keys: k, id: id, Lease: lease}, nil
	}
	_ = lease.Release(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	return nil, ErrEnded
}

// Finish records the run's end before its lock is released: again, if asynq
// will run the task again, so that it stays a live (queued) run. It reports
// whether the run was still live: false if a later tick ended it meanwhile
// (cancel_previous, or it found the run's lock gone).
func (r *Run) Finish(ctx context.Context, again bool) (live bool, err error) {
	flag := "0"
	if again {
		flag = "1"
	}
	res, err := script.Run(ctx, r.client, scriptFinish, "overlap finish", []string{r.keys.Runs}, r.id, flag)
	return res == int64(1), err
}
