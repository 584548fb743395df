package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// This file reads Lockstep's state from Redis for the CLI and the page; the
// layouts it reads are internal/lock's (through its key builder and its
// Waiters) and asynq's (through its Inspector).

// lockView is one held lock, or one held permit of a resource with a limit,
// as `lockstep locks --json` prints it.
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
	Waiters  int64  `json:"waiters"`
}

// keys builds the Redis keys: the lock package's key builder, with the prefix.
func (a *app) keys() *lock.Locker { return lock.New(a.client, lock.WithPrefix(a.prefix)) }

// scanBatch is how many keys one SCAN step returns and one pipeline reads.
const scanBatch = 500

// errRedlock: with lock.backend redlock the locks live on lock.nodes, which
// these views do not read yet.
var errRedlock = errors.New("lock.backend is redlock: its locks live on lock.nodes, which lockstep does not read yet")

func redlock(a *app) bool { return a.config != nil && a.config.Lock.Backend == config.BackendRedlock }

// listLocks returns every held lock, longest held first.
func listLocks(ctx context.Context, a *app) ([]lockView, error) {
	if redlock(a) {
		return nil, errRedlock
	}
	now, err := serverTime(ctx, a.client)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var out []lockView
	err = forEachMaster(ctx, a.client, func(ctx context.Context, node redis.Cmdable) error {
		var batch []string
		flush := func() error {
			views, err := readLocks(ctx, a, batch, now)
			mu.Lock()
			out = append(out, views...)
			mu.Unlock()
			batch = batch[:0]
			return err
		}
		// Lock keys (permit 0s), and the limits of resources with permits,
		// whose permit 0 may be free while others are held.
		seen := map[string]bool{}
		for _, pattern := range []string{a.keys().ScanPattern(), a.keys().LimitPattern()} {
			iter := node.Scan(ctx, 0, pattern, scanBatch).Iterator()
			for iter.Next(ctx) {
				r, ok := resourceOf(a.prefix, strings.TrimSuffix(iter.Val(), ":limit"))
				if ok && !seen[r] {
					seen[r] = true
					batch = append(batch, r)
				}
				if len(batch) == scanBatch {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			if err := iter.Err(); err != nil {
				return err
			}
		}
		return flush()
	})
	if err != nil {
		return nil, err
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
	if out == nil {
		out = []lockView{}
	}
	return out, nil
}

// resourceOf returns R for a lock key prefix{R}; the other keys of a
// resource (fence counter, waiters, ...) end after the brace.
func resourceOf(prefix, key string) (string, bool) {
	r, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	r, ok = strings.CutSuffix(r, "}")
	return r, ok && r != "" && !strings.ContainsAny(r, "{}")
}

// readLocks reads the locks on resources in one pipeline: value, TTL, fence
// counter and waiter count. A key that is gone or not a lock is left out.
func readLocks(ctx context.Context, a *app, resources []string, now time.Time) ([]lockView, error) {
	if len(resources) == 0 {
		return nil, nil
	}
	k := a.keys()
	type cmds struct {
		val     *redis.StringCmd
		ttl     *redis.DurationCmd
		fence   *redis.StringCmd
		waiters *redis.IntCmd // the resource's one queue: parked tasks and WithLock / Acquire callers
		limit   *redis.SliceCmd
	}
	cs := make([]cmds, len(resources))
	_, _ = a.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range resources {
			cs[i] = cmds{
				val:     p.Get(ctx, k.Key(r)),
				ttl:     p.PTTL(ctx, k.Key(r)),
				fence:   p.Get(ctx, k.FenceKey(r)),
				waiters: p.ZCard(ctx, k.QueueKey(r)),
				limit:   p.HMGet(ctx, k.LimitKey(r), "n", "h"),
			}
		}
		return nil
	})
	// A resource with permits: its permits 1 to h-1, in a second pipeline.
	type permitCmds struct {
		r, k int
		cmds
	}
	var more []permitCmds
	limits := make([]int, len(resources))
	for i, c := range cs {
		limits[i] = 1
		v := c.limit.Val()
		if len(v) != 2 || v[0] == nil {
			continue
		}
		n, _ := strconv.Atoi(fmt.Sprint(v[0]))
		h, _ := strconv.Atoi(fmt.Sprint(v[1]))
		limits[i] = max(n, 1)
		for p := 1; p < h; p++ {
			more = append(more, permitCmds{r: i, k: p})
		}
	}
	if len(more) > 0 {
		_, _ = a.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := range more {
				m := &more[j]
				key := k.PermitKey(resources[m.r], m.k)
				m.val, m.ttl, m.fence = p.Get(ctx, key), p.PTTL(ctx, key), p.Get(ctx, k.PermitFenceKey(resources[m.r], m.k))
				m.waiters = cs[m.r].waiters
			}
			return nil
		})
	}
	all := make([]permitCmds, 0, len(cs)+len(more))
	for i, c := range cs {
		all = append(all, permitCmds{r: i, cmds: c})
	}
	all = append(all, more...)
	var out []lockView
	for _, c := range all {
		r := resources[c.r]
		switch err := c.val.Err(); {
		case errors.Is(err, redis.Nil), isWrongType(err): // gone since the scan, or not a lock
			continue
		case err != nil:
			return nil, fmt.Errorf("redis: %w", err)
		}
		info := lock.ParseToken(c.val.Val())
		v := lockView{Resource: r, Limit: limits[c.r], Permit: c.k, Holder: info.Holder, TaskID: info.TaskID, Type: info.Type}
		v.Fence, _ = c.fence.Int64()
		if d := c.ttl.Val(); d > 0 {
			v.TTLMs = d.Milliseconds()
		} else {
			v.TTLMs = -1 // no expiry: not written by Lockstep
		}
		if !info.Acquired.IsZero() {
			held := max(now.Sub(info.Acquired).Milliseconds(), 0)
			v.HeldMs = &held
		}
		v.Waiters = c.waiters.Val()
		out = append(out, v)
	}
	return out, nil
}

func isWrongType(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE") }

// serverTime is Redis's clock: held_ms is measured against it, not against
// the operator's machine.
func serverTime(ctx context.Context, c redis.UniversalClient) (time.Time, error) {
	t, err := c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis: %w", err)
	}
	return t, nil
}

// forEachMaster runs fn on every master of a Cluster, or once on the client.
func forEachMaster(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, c)
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
	ws, err := a.keys().Waiters(ctx, resource)
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
