package overlap

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

	scriptTick   = script.New("overlap/tick.lua", tickLua)
	scriptStart  = script.New("overlap/start.lua", startLua)
	scriptFinish = script.New("overlap/finish.lua", finishLua)
)

// Keys are a schedule's keys for its runs.
type Keys struct {
	Runs     string // hash: task id -> "q <ms>", "q", "r" or "x <task id>" (tick.lua)
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
// last registration. Under cancel_previous the hold of a run it ends is
// ended through locks, the Locker of run locks (Locker.Break): the run lock
// goes to the next run waiting for it at once.
func Tick(ctx context.Context, c redis.UniversalClient, insp *asynq.Inspector, locks *lock.Locker, k Keys, state string,
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
	if !ok || len(a) != 5 {
		return Decision{}, fmt.Errorf("overlap tick: unexpected reply %v", res)
	}
	n := func(i int) int { v, _ := a[i].(int64); return int(v) }
	d := Decision{Run: n(0) == 1, Queued: n(1), Running: n(2), Cancelled: n(3)}
	if holder, _ := a[4].(string); holder != "" {
		// The run is marked ended: a retry of this tick finds it registered
		// and does not come here again, so the hold must end now.
		if _, err := locks.Break(context.WithoutCancel(ctx), lock.Held{Resource: k.Resource, Token: holder, Limit: 1}); err != nil {
			return d, fmt.Errorf("overlap: end the cancelled run's hold of %s: %w", k.Resource, err)
		}
	}
	return d, nil
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
	v, err := c.HGet(ctx, k.Runs, id).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("overlap: run %s: %w", id, err)
	}
	if err != nil || strings.HasPrefix(v, cancelledMark) { // ended before it started: do not wait for the lock
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

// cancelledMark starts the runs value of a run that a later tick cancelled:
// "x <that tick's task id>" (tick.lua).
const cancelledMark = "x "

// schedule is the schedule's name in k (its run lock's resource is
// "schedule:<name>").
func schedule(k Keys) string { return strings.TrimPrefix(k.Resource, "schedule:") }

// CancelledError is the cause of a run's context that a later tick
// cancelled (cancel_previous): it names that tick, and wraps the run lock's
// loss, so errors.Is(cause, lock.ErrLockLost) holds and errors.As gives the
// *lock.LostError, as for any lost lock.
type CancelledError struct {
	Schedule string
	Run      string    // the cancelled run's task id
	By       string    // the task id of the tick that cancelled it
	Tick     time.Time // that tick's time (a trigger's: when it was made); zero if its id has none
	Lost     *lock.LostError
}

func (e *CancelledError) Error() string {
	by := e.By
	if !e.Tick.IsZero() {
		by += " at " + e.Tick.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("schedule %s: run %s cancelled by tick %s (overlap cancel_previous): %v", e.Schedule, e.Run, by, e.Lost)
}

func (e *CancelledError) Unwrap() error { return e.Lost }

// Cancelled explains the loss of r's run lock: a *CancelledError naming the
// tick that cancelled the run, read from its mark in runs within timeout,
// or nil (the lock was lost otherwise, or Redis did not say in time). It is
// the run lock's watchdog.Explain.
func (r *Run) Cancelled(lost *lock.LostError, timeout time.Duration) error {
	if lost.Reason != lock.ReasonExpired && lost.Reason != lock.ReasonStolen {
		return nil // unreachable, max_hold: no tick took it
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	v, err := r.client.HGet(ctx, r.keys.Runs, r.id).Result()
	by, ok := strings.CutPrefix(v, cancelledMark)
	if err != nil || !ok {
		return nil
	}
	name := schedule(r.keys)
	return &CancelledError{Schedule: name, Run: r.id, By: by, Tick: tickOf(name, by), Lost: lost}
}

// tickOf is the time in a tick's task id: "<schedule>:<unix seconds>" (a
// cron tick, a backfilled one) or "<schedule>:trigger:<unix ms>-<hex>".
func tickOf(schedule, id string) time.Time {
	rest, ok := strings.CutPrefix(id, schedule+":")
	if !ok {
		return time.Time{}
	}
	if ms, ok := strings.CutPrefix(rest, "trigger:"); ok {
		ms, _, _ = strings.Cut(ms, "-")
		if u, err := strconv.ParseInt(ms, 10, 64); err == nil {
			return time.UnixMilli(u)
		}
		return time.Time{}
	}
	if u, err := strconv.ParseInt(rest, 10, 64); err == nil {
		return time.Unix(u, 0)
	}
	return time.Time{}
}
