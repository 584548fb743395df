package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Held is one lock as its back end stores it: what the operator's view
// (cmd/lockstep) shows and what Break takes.
type Held struct {
	Resource string
	Permit   int           // which permit of a resource with a limit (0 for a lock)
	Limit    int           // the resource's limit (1 for a lock)
	Token    string        // the holder's token; ParseToken says who holds it
	Fence    int64         // the holder's fence
	TTL      time.Duration // left until it expires unless renewed; -1: no expiry (not written by Lockstep)
	Queued   int64         // Acquire callers waiting in the lock's queue (single and etcd)
	// Progress is the holder's last progress as of its last renewal, by
	// the server's clock, for a holder that reports it (StallAfter; Redis
	// and Cluster); zero otherwise.
	Progress time.Time
	// Nodes are the Redlock nodes (addresses) that hold this token, a
	// majority; nil on the other back ends.
	Nodes []string
}

// inspector is the operator's access to a back end's locks: every back end
// has one, so that no other package reads or builds lock keys.
type inspector interface {
	// locks returns every lock held under prefix (prefix + "{"), in no order.
	locks(ctx context.Context, l *Locker) ([]Held, error)
	// heldOne returns permit k of the lock on resource (0: the lock), or
	// nil when it is free.
	heldOne(ctx context.Context, l *Locker, resource string, k int) (*Held, error)
	// breakLock ends h's hold, only where the lock still holds h's token
	// (Break), and reports whether it did.
	breakLock(ctx context.Context, l *Locker, h Held) (bool, error)
}

// Locks returns every lock held under the Locker's prefix, in no order.
func (l *Locker) Locks(ctx context.Context) ([]Held, error) { return l.be.(inspector).locks(ctx, l) }

// Held returns the lock on resource as its back end holds it, or nil when
// the resource is free; for a resource with a limit, its permit 0.
func (l *Locker) Held(ctx context.Context, resource string) (*Held, error) {
	return l.be.(inspector).heldOne(ctx, l, resource, 0)
}

// HeldPermit returns permit k of resource (a resource with a limit; permit
// 0 is Held), or nil when it is free. Redlock has no permits.
func (l *Locker) HeldPermit(ctx context.Context, resource string, k int) (*Held, error) {
	return l.be.(inspector).heldOne(ctx, l, resource, k)
}

// Break ends the hold h (as Held or Locks returned it) if the lock still
// holds h's token, wherever the back end keeps it, as a release would: on
// Redis the first waiter holds it in the same step (release.lua, forced),
// else the key goes; on etcd the key goes and the first waiter takes it.
// The holder sees the loss (reason stolen, or expired when the key went) at
// its next renewal, at once where the back end tells it (etcd's watch,
// Redis client tracking). It reports false when the lock changed hands
// meanwhile, leaving the new holder's lock alone.
func (l *Locker) Break(ctx context.Context, h Held) (bool, error) {
	return l.be.(inspector).breakLock(ctx, l, h)
}

// resourceOf returns R for a lock key prefix{R}; the other keys of a
// resource (fence counter, owners, queue, ...) go on after the brace.
func resourceOf(prefix, key string) (string, bool) {
	r, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	r, ok = strings.CutSuffix(r, "}")
	return r, ok && r != "" && !strings.ContainsAny(r, "{}")
}

// scanBatch is how many keys one SCAN step returns and one pipeline reads.
const scanBatch = 500

// scanLocks calls fn with the resources of the lock keys on node (every
// master of a Cluster), scanBatch at a time.
func scanLocks(ctx context.Context, l *Locker, node redis.UniversalClient, fn func(context.Context, redis.Cmdable, []string) error) error {
	each := func(ctx context.Context, n redis.Cmdable) error {
		// Lock keys (permit 0s), and the limits of resources with permits,
		// whose permit 0 may be free while others are held.
		var batch []string
		seen := map[string]bool{}
		for _, pattern := range []string{l.ScanPattern(), l.LimitPattern()} {
			iter := n.Scan(ctx, 0, pattern, scanBatch).Iterator()
			for iter.Next(ctx) {
				if r, ok := resourceOf(l.prefix, strings.TrimSuffix(iter.Val(), ":limit")); ok && !seen[r] {
					seen[r] = true
					batch = append(batch, r)
				}
				if len(batch) == scanBatch {
					if err := fn(ctx, n, batch); err != nil {
						return err
					}
					batch = batch[:0]
				}
			}
			if err := iter.Err(); err != nil {
				return err
			}
		}
		if len(batch) == 0 {
			return nil
		}
		return fn(ctx, n, batch)
	}
	return onEveryMaster(ctx, node, each)
}

// onEveryMaster calls each with every master of a Cluster (at once), or
// with node itself.
func onEveryMaster(ctx context.Context, node redis.UniversalClient, each func(context.Context, redis.Cmdable) error) error {
	if cc, ok := node.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return each(ctx, n) })
	}
	return each(ctx, node)
}

// readRedis reads the locks on resources from one Redis node in one
// pipeline: value, TTL, fencing counter and queue length. A key that is gone
// is left out, or with free kept with an empty token (its fencing counter is
// what Redlock's view needs); one that is not a string is left out.
func readRedis(ctx context.Context, l *Locker, node redis.Cmdable, resources []string, free bool) ([]Held, error) {
	type cmds struct {
		r, k       int
		val, fence *redis.StringCmd
		progress   *redis.StringCmd
		ttl        *redis.DurationCmd
		queued     *redis.IntCmd
		limit      *redis.SliceCmd
	}
	read := func(p redis.Pipeliner, k keys, c *cmds) {
		c.val, c.ttl, c.fence, c.progress = p.Get(ctx, k.lock), p.PTTL(ctx, k.lock), p.Get(ctx, k.fence), p.Get(ctx, k.progressKey())
	}
	cs := make([]cmds, len(resources))
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range resources {
			k := l.keysFor(r)
			cs[i].r = i
			read(p, k, &cs[i])
			cs[i].queued, cs[i].limit = p.ZCard(ctx, k.queue), p.HMGet(ctx, k.limitKey(), "n", "h")
		}
		return nil
	})
	// A resource with a limit: its permits 1 to h-1, in a second pipeline.
	limits := make([]int, len(resources))
	var more []cmds
	for i, c := range cs {
		limits[i] = 1
		v := c.limit.Val()
		if len(v) != 2 || v[0] == nil {
			continue
		}
		n, _ := strconv.Atoi(fmt.Sprint(v[0]))
		h, _ := strconv.Atoi(fmt.Sprint(v[1]))
		limits[i] = max(n, 1)
		for k := 1; k < h; k++ {
			more = append(more, cmds{r: i, k: k, queued: c.queued})
		}
	}
	if len(more) > 0 {
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := range more {
				read(p, l.keysFor(resources[more[j].r]).permitKeys(more[j].k), &more[j])
			}
			return nil
		})
	}
	var out []Held
	for _, c := range append(cs, more...) {
		switch err := c.val.Err(); {
		case errors.Is(err, redis.Nil) && free && c.k == 0:
		case errors.Is(err, redis.Nil), err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
			continue // gone since the scan, or not a lock
		case err != nil:
			return nil, fmt.Errorf("redis: %w", err)
		}
		h := Held{Resource: resources[c.r], Permit: c.k, Limit: limits[c.r], Token: c.val.Val(), TTL: -1, Queued: c.queued.Val()}
		h.Fence, _ = c.fence.Int64()
		if at, token, ok := strings.Cut(c.progress.Val(), " "); ok && token == h.Token && h.Token != "" {
			if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
				h.Progress = time.UnixMilli(ms)
			}
		}
		if d := c.ttl.Val(); d > 0 {
			h.TTL = d
		}
		out = append(out, h)
	}
	return out, nil
}

func (b *single) locks(ctx context.Context, l *Locker) ([]Held, error) {
	var mu sync.Mutex
	var out []Held
	err := scanLocks(ctx, l, b.client, func(ctx context.Context, n redis.Cmdable, rs []string) error {
		hs, err := readRedis(ctx, l, n, rs, false)
		mu.Lock()
		out = append(out, hs...)
		mu.Unlock()
		return err
	})
	return out, err
}

func (b *single) heldOne(ctx context.Context, l *Locker, resource string, k int) (*Held, error) {
	hs, err := readRedis(ctx, l, b.client, []string{resource}, false)
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		if h.Permit == k {
			return &h, nil
		}
	}
	return nil, nil
}

// breakLock ends h's hold as a release would (release.lua, forced): the
// first waiter, a goroutine or a parked task, holds the resource in the
// same step with a fence above h's; without one the key goes. A task
// granted the lock holds it for DefaultTTL until its worker takes it over.
func (b *single) breakLock(ctx context.Context, l *Locker, h Held) (bool, error) {
	return endHold(ctx, b.client, l.keysFor(h.Resource).permitKeys(h.Permit), h.Token, h.Limit, b.fenceTTL)
}

// forcedEnd is release.lua's owner of a forced end: every reentrant hold of
// the token ends at once.
const forcedEnd = "!"

// endHold ends the hold of token on key's permit on node (breakLock), and
// reports whether it did: false when the key had expired or changed hands.
func endHold(ctx context.Context, node redis.UniversalClient, k keys, token string, limit int, fenceTTL time.Duration) (bool, error) {
	st, err := releaseOn(ctx, node, k, token, forcedEnd, counterTTL(DefaultTTL, fenceTTL), DefaultTTL, limit)
	if err != nil {
		return false, fmt.Errorf("redis: %w", err)
	}
	return st == 1, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nodeName is how the operator's view names a Redlock node: its address.
func nodeName(i int, n redis.UniversalClient) string {
	if c, ok := n.(*redis.Client); ok {
		return c.Options().Addr
	}
	return fmt.Sprintf("node %d", i)
}

// redlockRead is what one node holds: resource -> its lock there.
type redlockRead map[string]Held

// readAll reads fn's locks on every node at once. A node that fails is
// left out; fewer than a quorum of nodes answering is an error.
func (r *redlock) readAll(ctx context.Context, fn func(context.Context, int, redis.UniversalClient) ([]Held, error)) ([]redlockRead, error) {
	reads := make([]redlockRead, len(r.nodes))
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Go(func() {
			hs, err := fn(ctx, i, n)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", nodeName(i, n), err)
				return
			}
			reads[i] = redlockRead{}
			for _, h := range hs {
				reads[i][h.Resource] = h
			}
		})
	}
	wg.Wait()
	answered := 0
	for _, rd := range reads {
		if rd != nil {
			answered++
		}
	}
	if answered < r.quorum {
		return nil, fmt.Errorf("redlock: %d of %d nodes answered, quorum %d: %w", answered, len(r.nodes), r.quorum, errors.Join(errs...))
	}
	return reads, nil
}

// agreed is the lock on resource where a quorum of nodes holds one token
// (reads has every node that answered, a free key with an empty token). Its
// fence is the counter that a quorum of nodes has, those the acquire set
// (a node whose grant came late, or that took the lock since, may have
// counted further), else the highest among the nodes that agree; its TTL is
// the time until fewer than a quorum hold it. nil when no token has a quorum.
func (r *redlock) agreed(resource string, reads []redlockRead) *Held {
	byToken := map[string][]int{}
	counters := map[int64]int{}
	for i, rd := range reads {
		if h, ok := rd[resource]; ok {
			counters[h.Fence]++
			if h.Token != "" {
				byToken[h.Token] = append(byToken[h.Token], i)
			}
		}
	}
	for token, nodes := range byToken {
		if len(nodes) < r.quorum {
			continue
		}
		h := Held{Resource: resource, Limit: 1, Token: token, Fence: -1}
		var ttls []time.Duration
		highest := int64(0)
		for _, i := range nodes {
			n := reads[i][resource]
			highest = max(highest, n.Fence)
			if counters[n.Fence] >= r.quorum {
				h.Fence = max(h.Fence, n.Fence)
			}
			h.Nodes = append(h.Nodes, nodeName(i, r.nodes[i]))
			ttls = append(ttls, n.TTL)
		}
		if h.Fence < 0 {
			h.Fence = highest
		}
		slices.Sort(ttls)
		h.TTL = ttls[len(ttls)-r.quorum] // the quorum-th longest
		return &h
	}
	return nil
}

func (r *redlock) locks(ctx context.Context, l *Locker) ([]Held, error) {
	// The resources with a lock key on some node, then each of them read on
	// every node (fencing counters included where the key is gone).
	var mu sync.Mutex
	var resources []string
	_, err := r.readAll(ctx, func(ctx context.Context, _ int, n redis.UniversalClient) ([]Held, error) {
		return nil, scanLocks(ctx, l, n, func(_ context.Context, _ redis.Cmdable, rs []string) error {
			mu.Lock()
			defer mu.Unlock()
			for _, res := range rs {
				if !slices.Contains(resources, res) {
					resources = append(resources, res)
				}
			}
			return nil
		})
	})
	if err != nil || len(resources) == 0 {
		return nil, err
	}
	var out []Held
	for from := 0; from < len(resources); from += scanBatch {
		batch := resources[from:min(from+scanBatch, len(resources))]
		reads, err := r.readAll(ctx, func(ctx context.Context, _ int, n redis.UniversalClient) ([]Held, error) {
			return readRedis(ctx, l, n, batch, true)
		})
		if err != nil {
			return nil, err
		}
		for _, res := range batch {
			if h := r.agreed(res, reads); h != nil {
				out = append(out, *h)
			}
		}
	}
	return out, nil
}

func (r *redlock) heldOne(ctx context.Context, l *Locker, resource string, k int) (*Held, error) {
	if k > 0 {
		return nil, nil // no permits on Redlock (CheckLimit)
	}
	reads, err := r.readAll(ctx, func(ctx context.Context, _ int, n redis.UniversalClient) ([]Held, error) {
		return readRedis(ctx, l, n, []string{resource}, true)
	})
	if err != nil {
		return nil, err
	}
	return r.agreed(resource, reads), nil
}

// breakLock ends the hold on every node that holds h's token (endHold). It
// is broken when fewer than a quorum of nodes still hold it.
func (r *redlock) breakLock(ctx context.Context, l *Locker, h Held) (bool, error) {
	k := l.keysFor(h.Resource)
	deleted := make([]bool, len(r.nodes))
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Go(func() {
			deleted[i], errs[i] = endHold(ctx, n, k, h.Token, 1, r.fenceTTL)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", nodeName(i, n), errs[i])
			}
		})
	}
	wg.Wait()
	unknown, anyDeleted := 0, false // unknown: nodes that did not answer, and may still hold it
	for i := range r.nodes {
		unknown += btoi(errs[i] != nil)
		anyDeleted = anyDeleted || deleted[i]
	}
	if unknown >= r.quorum {
		return false, fmt.Errorf("redlock: %d nodes did not answer and may still hold the lock, quorum %d: %w", unknown, r.quorum, errors.Join(errs...))
	}
	return anyDeleted, nil
}

// etcd: permit k of resource R is the key P{R} (k = 0) or P{R}:p<k>, the
// revision that last wrote it (its create, or a hand-off) the fence, bound to
// a lease whose time to live is the permit's TTL left; P{R}:limit holds the
// limit of a resource with permits; P{R}:queue:<id> are the places in line.
func (b *etcdBackend) locks(ctx context.Context, l *Locker) ([]Held, error) {
	resp, err := b.get(ctx, opGetPrefix(b.watchPrefix))
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return b.heldFrom(ctx, l, resp.Kvs)
}

// heldFrom turns the keys kvs (any keys under the prefix) into the permits
// they hold, each with its resource's limit (etcdLimit).
func (b *etcdBackend) heldFrom(ctx context.Context, l *Locker, kvs []*EtcdKV) ([]Held, error) {
	var out []Held
	limits := map[string]int{}
	ttls := map[int64]time.Duration{} // by lease id: the shared leases are asked once
	queued := map[string]int64{}
	for _, kv := range kvs {
		if r, ok := l.limitOf(string(kv.Key)); ok {
			limits[r], _ = strconv.Atoi(string(kv.Value))
			continue
		}
		if r, ok := l.waiterOf(string(kv.Key)); ok {
			queued[r]++
			continue
		}
		r, k, ok := l.permitOf(string(kv.Key))
		if !ok {
			continue
		}
		h := Held{Resource: r, Permit: k, Token: string(kv.Value), Fence: kv.ModRevision, TTL: -1}
		if kv.Lease != 0 {
			ttl, ok := ttls[kv.Lease]
			if !ok {
				left, err := b.cl.TimeToLive(ctx, kv.Lease)
				if err != nil {
					return nil, fmt.Errorf("etcd: lease of %q: %w", r, err)
				}
				ttl = time.Duration(max(left, 0)) * time.Second
				ttls[kv.Lease] = ttl
			}
			h.TTL = ttl
		}
		out = append(out, h)
	}
	highest := map[string]int{}
	for _, h := range out {
		highest[h.Resource] = max(highest[h.Resource], h.Permit)
	}
	for i, h := range out {
		out[i].Limit = etcdLimit(limits[h.Resource], highest[h.Resource])
		out[i].Queued = queued[h.Resource]
	}
	return out, nil
}

// etcdLimit is the limit the operator's view shows: the latest declared n
// when its key is there, else (its declarer's lease expired, or a lock) as
// many permits as the highest one held says there are.
func etcdLimit(n, highest int) int {
	if n > 0 {
		return n
	}
	return highest + 1
}

// resourceKeys reads every key of resource (its permits, owners and limit).
func (b *etcdBackend) resourceKeys(ctx context.Context, l *Locker, resource string) ([]*EtcdKV, error) {
	resp, err := b.get(ctx, opGetPrefix(l.keysFor(resource).lock))
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return resp.Kvs, nil
}

func (b *etcdBackend) heldOne(ctx context.Context, l *Locker, resource string, k int) (*Held, error) {
	kvs, err := b.resourceKeys(ctx, l, resource)
	if err != nil {
		return nil, err
	}
	hs, err := b.heldFrom(ctx, l, kvs)
	for _, h := range hs {
		if h.Resource == resource && h.Permit == k {
			return &h, err
		}
	}
	return nil, err
}

// permitLimit is Limit on etcd: the latest declared limit, or
// more when a permit above it is held (a lowered limit).
func (b *etcdBackend) permitLimit(ctx context.Context, l *Locker, resource string) (int, error) {
	kvs, err := b.resourceKeys(ctx, l, resource)
	if err != nil {
		return 0, err
	}
	n := 1
	for _, kv := range kvs {
		if r, ok := l.limitOf(string(kv.Key)); ok && r == resource {
			v, _ := strconv.Atoi(string(kv.Value))
			n = max(n, v)
		} else if r, k, ok := l.permitOf(string(kv.Key)); ok && r == resource {
			n = max(n, k+1)
		}
	}
	return n, nil
}

// breakLock deletes the permit's lock key and its owners key in one
// transaction, if the key still holds h's token and fence; the holder's
// watch sees the delete and cancels it (expired).
func (b *etcdBackend) breakLock(ctx context.Context, l *Locker, h Held) (bool, error) {
	k := l.keysFor(h.Resource).permitKeys(h.Permit)
	resp, err := b.txn(ctx).
		If(cmpValue(k.lock, h.Token), cmpMod(k.lock, "=", h.Fence)).
		Then(opDelete(k.lock), opDelete(k.owners)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("etcd: %w", err)
	}
	return resp.Succeeded, nil
}

var (
	_ inspector = (*single)(nil)
	_ inspector = (*redlock)(nil)
	_ inspector = (*etcdBackend)(nil)
)

// Limit returns how many permits of resource may be held (its limit, or the
// higher one its holders declared before a lowered limit): 1 for a lock, on
// back ends without permits, and for a resource that has no holder.
func (l *Locker) Limit(ctx context.Context, resource string) (int, error) {
	if e, ok := l.be.(*etcdBackend); ok {
		return e.permitLimit(ctx, l, resource)
	}
	b, ok := l.be.(*single)
	if !ok {
		return 1, nil
	}
	h, err := b.client.HGet(ctx, l.keysFor(resource).limitKey(), "h").Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("redis: %w", err)
	}
	return max(h, 1), nil
}
