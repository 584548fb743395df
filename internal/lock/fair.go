package lock

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// FairStride is the stride of a tenant of weight 1 on a fair scope's
// virtual clock (lua/fair.lua); weight w moves it FairStride/w per task.
const FairStride = 1_000_000

// MaxFairWeight bounds a tenant's weight, so that its stride stays at least 1
// and shares stay exact to a thousandth.
const MaxFairWeight = 1000

// FairScope is the resource whose keys order the tasks of type typ in queue
// by fair share: fair:["<queue>","<type>"] (prefix{fair:[...]}:fair...).
func FairScope(queue, typ string) string {
	b, _ := json.Marshal([]string{queue, typ})
	return "fair:" + string(b)
}

// ParseFairScope returns the queue and type of a FairScope.
func ParseFairScope(scope string) (queue, typ string, ok bool) {
	var w []string
	rest, found := strings.CutPrefix(scope, "fair:")
	if !found || json.Unmarshal([]byte(rest), &w) != nil || len(w) != 2 {
		return "", "", false
	}
	return w[0], w[1], true
}

// FairTask is a task of a fair scope: its id (in the scope's queue), its
// tenant and the tenant's weight (1 to MaxFairWeight).
type FairTask struct {
	ID, Tenant string
	Weight     int
}

// Fairness is what Fair decided.
type Fairness struct {
	// Run: the asking task starts now. False: it waits, its tag kept; it
	// runs when a release starts it (it is then in Started of that call).
	Run bool
	// Started are tasks started for free worker slots, smallest tag first:
	// each runs on its next delivery, so the caller brings back those parked.
	Started []string
	// Park are the tasks seen that wait now (not the asking one): the
	// caller parks those still pending.
	Park []string
}

// FairAsk is one call of Fair.
type FairAsk struct {
	// Self is the task asking to run ("" none); Force runs it now whatever
	// its turn (it cannot wait), marked started.
	Self  string
	Force bool
	// Seen are the scope's tasks in the order they arrived (Self among
	// them unless Force): each one not seen before gets its tag.
	Seen []FairTask
	// Done is a task whose run ended ("" none): it is no longer started.
	Done string
	// Release is the caller's free worker slots (one more when Self
	// waits: its slot frees): as many waiting tasks are started as that
	// exceeds the starts still on their way to a worker; with Done, at
	// least one, for the slot the run's end frees.
	Release int
	// TTL is the scope's keys' life after the call: longer than a parked
	// task waits for its fallback.
	TTL time.Duration
}

func stride(weight int) int64 { return FairStride / int64(min(max(weight, 1), MaxFairWeight)) }

// Fair decides a fair scope's starts (lua/fair.lua, start-time fair
// queuing): it tags the tasks seen, tells whether Self starts now, and
// starts up to Release more of the waiting tasks, smallest tag first. Only
// the single back end has it (the queue's Redis).
func (l *Locker) Fair(ctx context.Context, scope string, a FairAsk) (Fairness, error) {
	b, ok := l.be.(*single)
	if !ok {
		return Fairness{}, fmt.Errorf("lock: fair %q: a fair share needs the single Redis back end (this one is %s)", scope, l.kind)
	}
	force := ""
	if a.Force {
		force = "1"
	}
	args := make([]any, 0, 5+3*len(a.Seen))
	args = append(args, max(a.TTL.Milliseconds(), 1), max(a.Release, 0), a.Done, a.Self, force)
	for _, t := range a.Seen {
		args = append(args, t.ID, t.Tenant, stride(t.Weight))
	}
	v, err := run(ctx, b.client, scriptFair, l.keysFor(scope).fairKeys(), args...)
	if err != nil {
		return Fairness{}, fmt.Errorf("lock: fair %q: %w", scope, err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 2 {
		return Fairness{}, fmt.Errorf("lock: fair %q: unexpected reply %v", scope, v)
	}
	runs, _ := reply[0].(int64)
	n, _ := reply[1].(int64)
	var out Fairness
	out.Run = runs == 1
	for i, x := range reply[2:] {
		id, _ := x.(string)
		if int64(i) < n {
			out.Started = append(out.Started, id)
		} else {
			out.Park = append(out.Park, id)
		}
	}
	return out, nil
}

// FairStarted returns those of ids that are started in scope (on their
// way to a worker or running): a caller that parked ids after its decision
// brings back those started meanwhile, whose wake may have found them still
// pending. One round trip.
func (l *Locker) FairStarted(ctx context.Context, scope string, ids []string) ([]string, error) {
	b, ok := l.be.(*single)
	if !ok || len(ids) == 0 {
		return nil, nil
	}
	key := l.keysFor(scope).fairKeys()[3]
	cmds := make([]*redis.FloatCmd, len(ids))
	_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.ZScore(ctx, key, id)
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("lock: fair %q: %w", scope, err)
	}
	var out []string
	for i, c := range cmds {
		if c.Err() == nil {
			out = append(out, ids[i])
		}
	}
	return out, nil
}

// FairLate returns the tasks of scope started more than after ago and not
// yet delivered (their wake may have died with its worker), oldest first.
// One round trip.
func (l *Locker) FairLate(ctx context.Context, scope string, after time.Duration) ([]string, error) {
	b, ok := l.be.(*single)
	if !ok {
		return nil, nil
	}
	now, err := b.client.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("lock: fair %q: %w", scope, err)
	}
	ids, err := b.client.ZRangeByScore(ctx, l.keysFor(scope).fairKeys()[4], &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now.Add(-after).UnixMilli(), 10)}).Result()
	if err != nil {
		return nil, fmt.Errorf("lock: fair %q: %w", scope, err)
	}
	return ids, nil
}

// FairTenant is one tenant of a fair scope with tasks waiting.
type FairTenant struct {
	Tenant  string
	Weight  int
	Backlog int     // its tasks waiting for their turn (parked)
	Share   float64 // its share of the scope's starts while these wait: Weight / the waiting tenants' weights
}

// FairState is a fair scope's state: the tenants with tasks waiting.
type FairState struct {
	Scope   string // FairScope(queue, type)
	Queue   string
	Type    string
	Tenants []FairTenant
	Started int // tasks started and not yet ended: on their way to a worker, or running
}

// Fairs returns the state of every live fair scope under the Locker's
// prefix, in no order, each tenant list by tenant; read only. Only the
// single back end has fair scopes.
func (l *Locker) Fairs(ctx context.Context) ([]FairState, error) {
	b, ok := l.be.(*single)
	if !ok {
		return nil, fmt.Errorf("lock: fairs: a fair share needs the single Redis back end (this one is %s)", l.kind)
	}
	var mu sync.Mutex
	var out []FairState
	each := func(ctx context.Context, n redis.Cmdable) error {
		iter := n.Scan(ctx, 0, globEscape(l.prefix)+"{*}:fair", scanBatch).Iterator()
		for iter.Next(ctx) {
			scope, ok := resourceOf(l.prefix, strings.TrimSuffix(iter.Val(), ":fair"))
			if _, _, fair := ParseFairScope(scope); !ok || !fair {
				continue
			}
			s, err := readFair(ctx, n, l.keysFor(scope).fairKeys(), scope)
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, s)
			mu.Unlock()
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		return nil
	}
	err := onEveryMaster(ctx, b.client, each)
	return out, err
}

// readFair reads one scope's state hash and started count in one round trip.
func readFair(ctx context.Context, n redis.Cmdable, keys []string, scope string) (FairState, error) {
	var h *redis.MapStringStringCmd
	var started *redis.IntCmd
	_, _ = n.Pipelined(ctx, func(p redis.Pipeliner) error {
		h = p.HGetAll(ctx, keys[0])
		started = p.ZCard(ctx, keys[3])
		return nil
	})
	if err := h.Err(); err != nil {
		return FairState{}, fmt.Errorf("redis: %w", err)
	}
	s := FairState{Scope: scope, Started: int(started.Val())}
	s.Queue, s.Type, _ = ParseFairScope(scope)
	sum := 0
	for f, val := range h.Val() {
		tenant, ok := strings.CutPrefix(f, "b:")
		backlog, err := strconv.Atoi(val)
		if !ok || err != nil || backlog <= 0 {
			continue
		}
		st, _ := strconv.ParseInt(h.Val()["s:"+tenant], 10, 64)
		w := 1
		if st > 0 {
			w = int((FairStride + st/2) / st)
		}
		s.Tenants = append(s.Tenants, FairTenant{Tenant: tenant, Weight: w, Backlog: backlog})
		sum += w
	}
	for i := range s.Tenants {
		s.Tenants[i].Share = float64(s.Tenants[i].Weight) / float64(sum)
	}
	sort.Slice(s.Tenants, func(i, j int) bool { return s.Tenants[i].Tenant < s.Tenants[j].Tenant })
	return s, nil
}
