package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// This file reads Lockstep's state for the CLI and the page: the locks
// through the lock back end's own reader (lock.Locker's Locks, Held and
// Break), on every back end; a resource's waiters through Locker.Waiters
// (the single back end's one queue); tasks through asynq's Inspector.

// lockView is one held lock, as `lockstep locks --json` prints it.
type lockView struct {
	Resource string `json:"resource"`
	Limit    int    `json:"limit"`   // the resource's limit: 1 for a lock
	Permit   int    `json:"permit"`  // which permit this is: 0 for a lock
	Holder   string `json:"holder"`  // host:pid of the holding process
	TaskID   string `json:"task_id"` // "" unless a job holds it
	Type     string `json:"type"`    // "" unless a job holds it
	Fence    int64  `json:"fence"`
	TTLMs    int64  `json:"ttl_ms"`  // time left until it expires unless renewed
	HeldMs   *int64 `json:"held_ms"` // since the acquire; null when the value does not say
	// ProgressMs: since the holder's last progress (as of its last
	// renewal), for a hold with StallAfter on Redis; null otherwise.
	ProgressMs *int64   `json:"progress_ms"`
	Waiters    int64    `json:"waiters"`
	Backend    string   `json:"backend"`         // lock.backend: redis, redlock or etcd
	Nodes      []string `json:"nodes,omitempty"` // redlock: the nodes that hold it, a majority
}

// backendName is lock.backend as the config says it (redis, redlock, etcd).
func (a *app) backendName() string {
	if a.config == nil || a.config.Lock.Backend == "" {
		return string(config.BackendRedis)
	}
	return string(a.config.Lock.Backend)
}

// listLocks returns every held lock, longest held first.
func listLocks(ctx context.Context, a *app) ([]lockView, error) {
	now, err := serverTime(ctx, a.client)
	if err != nil {
		return nil, err
	}
	held, err := a.locker.Locks(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]lockView, 0, len(held))
	for _, h := range held {
		info := lock.ParseToken(h.Token)
		v := lockView{Resource: h.Resource, Limit: max(h.Limit, 1), Permit: h.Permit, Holder: info.Holder, TaskID: info.TaskID, Type: info.Type, Fence: h.Fence,
			TTLMs: -1, Waiters: h.Queued, Backend: a.backendName(), Nodes: h.Nodes}
		if h.TTL >= 0 {
			v.TTLMs = h.TTL.Milliseconds() // -1: no expiry, not written by Lockstep
		}
		if !info.Acquired.IsZero() {
			held := max(now.Sub(info.Acquired).Milliseconds(), 0)
			v.HeldMs = &held
		}
		if !h.Progress.IsZero() {
			since := max(now.Sub(h.Progress).Milliseconds(), 0)
			v.ProgressMs = &since
		}
		if v.TaskID != "" && v.Type == "" { // granted, or run by a chain: asynq knows its type
			if t, err := findTask(a, v.TaskID); err == nil {
				v.Type = t.Type
			}
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(x, y lockView) int {
		hx, hy := int64(-1), int64(-1)
		if x.HeldMs != nil {
			hx = *x.HeldMs
		}
		if y.HeldMs != nil {
			hy = *y.HeldMs
		}
		return cmp.Or(cmp.Compare(hy, hx), strings.Compare(x.Resource, y.Resource), cmp.Compare(x.Permit, y.Permit))
	})
	return out, nil
}

// rateView is a live rate key's state (a key of HandlerOf.Rate or Allow),
// as `lockstep rates --json` prints it.
type rateView struct {
	Key        string `json:"key"`
	IntervalUs int64  `json:"interval_us"` // Per/N of the limit it was last counted under
	Burst      int    `json:"burst"`
	BurstLeft  int    `json:"burst_left"` // admissions it allows at once now
	NextMs     int64  `json:"next_ms"`    // when it allows one, Unix ms on Redis's clock
	WaitMs     int64  `json:"wait_ms"`    // from now until then: 0 when it allows one now
	Backend    string `json:"backend"`    // redis: rate keys live in the queue's Redis
}

// listRates returns every live rate key, the soonest to allow one first,
// read by the lock package (Locker.Rates) from the queue's Redis, where rate
// keys live whatever lock.backend says.
func listRates(ctx context.Context, a *app) ([]rateView, error) {
	l := a.locker
	if l.Backend() != "single" {
		l = lock.New(a.client, lock.WithPrefix(a.prefix))
	}
	rs, err := l.Rates(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]rateView, 0, len(rs))
	for _, r := range rs {
		out = append(out, rateView{Key: r.Key, IntervalUs: r.Interval.Microseconds(), Burst: r.Burst, BurstLeft: r.BurstLeft,
			NextMs: r.Next.UnixMilli(), WaitMs: (r.Next.Sub(r.Now) + time.Millisecond - 1).Milliseconds(), Backend: "redis"})
	}
	slices.SortFunc(out, func(x, y rateView) int { return cmp.Or(cmp.Compare(x.WaitMs, y.WaitMs), strings.Compare(x.Key, y.Key)) })
	return out, nil
}

// fairView is one tenant with tasks waiting for their fair share, as
// `lockstep fair --json` prints it.
type fairView struct {
	Queue   string  `json:"queue"`
	Type    string  `json:"type"`
	Tenant  string  `json:"tenant"`
	Weight  int     `json:"weight"`
	Backlog int     `json:"backlog"` // its tasks waiting for their turn
	Share   float64 `json:"share"`   // its share of the starts while these wait: 0 to 1
	Started int     `json:"started"` // the type's tasks started and not yet ended in the queue
	Backend string  `json:"backend"` // redis: fair shares live in the queue's Redis
}

// listFair returns each tenant waiting in a fair share, by queue, type and
// tenant, read by the lock package (Locker.Fairs) from the queue's Redis.
func listFair(ctx context.Context, a *app) ([]fairView, error) {
	l := a.locker
	if l.Backend() != "single" {
		l = lock.New(a.client, lock.WithPrefix(a.prefix))
	}
	fs, err := l.Fairs(ctx)
	if err != nil {
		return nil, err
	}
	out := []fairView{}
	for _, f := range fs {
		for _, t := range f.Tenants {
			out = append(out, fairView{Queue: f.Queue, Type: f.Type, Tenant: t.Tenant, Weight: t.Weight, Backlog: t.Backlog,
				Share: t.Share, Started: f.Started, Backend: "redis"})
		}
	}
	slices.SortFunc(out, func(x, y fairView) int {
		return cmp.Or(strings.Compare(x.Queue, y.Queue), strings.Compare(x.Type, y.Type), strings.Compare(x.Tenant, y.Tenant))
	})
	return out, nil
}

// serverTime is Redis's clock: held_ms is measured against it, not against
// the operator's machine.
func serverTime(ctx context.Context, c redis.UniversalClient) (time.Time, error) {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis: %w", err)
	}
	return t, nil
}

// waiterView is one waiter of a lock, as `lockstep waiters --json` prints
// it: a parked task (kind "task") or a WithLock / Acquire caller ("call").
type waiterView struct {
	Position int    `json:"position"` // 1 is served first
	Kind     string `json:"kind"`     // "task" or "call"
	Queue    string `json:"queue"`
	TaskID   string `json:"task_id"`
	Type     string `json:"type"`      // "" when asynq no longer has the task
	State    string `json:"state"`     // a task's asynq state: retry (waiting), pending (woken), active, ...; a call's "waiting" or "gone"
	Holder   string `json:"holder"`    // a call's process (host:pid)
	SinceMs  int64  `json:"since_ms"`  // arrival in the queue, Unix ms
	WaitedMs int64  `json:"waited_ms"` // since then
}

// waitQueue reads the resource's waiters in the order they will be served,
// through the lock package (Locker.Waiters).
func waitQueue(ctx context.Context, a *app, resource string) ([]waiterView, error) {
	ws, err := a.locker.Waiters(ctx, resource)
	if err != nil {
		return nil, err
	}
	out := make([]waiterView, 0, len(ws))
	for _, w := range ws {
		v := waiterView{Position: w.Position, Kind: "task", Queue: w.Queue, TaskID: w.TaskID, SinceMs: w.Since.UnixMilli()}
		if w.TaskID == "" {
			v.Kind, v.Holder, v.TaskID, v.Type, v.State = "call", w.Caller.Holder, w.Caller.TaskID, w.Caller.Type, "waiting"
			if !w.Live {
				v.State = "gone"
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// listWaiters returns the waiters of resource with their asynq state and type.
func listWaiters(ctx context.Context, a *app, resource string) ([]waiterView, error) {
	ws, err := waitQueue(ctx, a, resource)
	if err != nil {
		return nil, err
	}
	now, err := serverTime(ctx, a.client)
	if err != nil {
		return nil, err
	}
	insp := asynq.NewInspectorFromRedisClient(a.client)
	for i := range ws {
		w := &ws[i]
		w.WaitedMs = max(now.UnixMilli()-w.SinceMs, 0)
		if w.Kind != "task" {
			continue
		}
		if info, err := insp.GetTaskInfo(w.Queue, w.TaskID); err == nil {
			w.Type, w.State = info.Type, info.State.String()
		} else {
			w.State = "gone"
		}
	}
	return ws, nil
}

// findTask looks a task id up in every asynq queue.
func findTask(a *app, id string) (*asynq.TaskInfo, error) {
	insp := asynq.NewInspectorFromRedisClient(a.client)
	queues, err := insp.Queues()
	if err != nil {
		return nil, err
	}
	slices.Sort(queues)
	for _, q := range queues {
		if info, err := insp.GetTaskInfo(q, id); err == nil {
			return info, nil
		}
	}
	return nil, asynq.ErrTaskNotFound
}
