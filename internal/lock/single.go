package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// single is the back end of one Redis deployment: a server, a
// Sentinel-managed master or a Cluster (New).
type single struct {
	client   redis.UniversalClient
	fenceTTL time.Duration
	replicas int // WaitReplicas: 0 = no WAIT
	replWait time.Duration

	// acquires, releases and rate admissions: concurrent calls share a
	// script call, except on a Cluster (nil there).
	acquires, releases, rates *batcher

	waits    chan struct{} // one slot per blocking wait a pool connection may serve
	maxBlock time.Duration // the longest blocking wait the client's read timeout allows
}

func newSingle(client redis.UniversalClient, s settings) *single {
	b := &single{client: client, fenceTTL: s.fenceTTL, replicas: s.replicas, replWait: s.replWait}
	if _, cluster := client.(*redis.ClusterClient); !cluster {
		b.acquires = &batcher{client: client, script: scriptAcquire, name: "acquire"}
		b.releases = &batcher{client: client, script: scriptRelease, name: "release"}
		b.rates = &batcher{client: client, script: scriptRate, name: "rate"}
	}
	pool, read := 10, 3*time.Second
	switch c := client.(type) {
	case *redis.Client:
		pool, read = c.Options().PoolSize, c.Options().ReadTimeout
	case *redis.ClusterClient:
		pool, read = c.Options().PoolSize, c.Options().ReadTimeout
	}
	// Blocking waits hold a pool connection each: at most half the pool, so
	// that the releases that wake them always find one.
	b.waits = make(chan struct{}, max(1, pool/2))
	// A blocking read must end before the client's read timeout would.
	b.maxBlock = time.Hour
	if read > 0 {
		b.maxBlock = read / 2
	}
	return b
}

// oneNode reports whether every key lives on one node (not a Cluster), so
// that one script may touch keys of different slots.
func (b *single) oneNode() bool { return b.acquires != nil }

func (*single) options() []string { return []string{optFenceTTL, optWaitReplicas} }

func (b *single) acquire(ctx context.Context, s *Lease) (bool, error) {
	keys, args := acquireArgs(s, b.fenceTTL)
	var g grant
	if b.replicas > 0 {
		g = b.acquireAndWait(ctx, s, keys, args)
	} else {
		reply, err := b.call(ctx, b.acquires, scriptAcquire, keys, args)
		g = parseGrant(0, s.token, reply, err)
	}
	if g.err != nil {
		return false, g.err
	}
	if s.wait != nil && g.status == 0 {
		s.wait.busy(s.sent, g.at)
	}
	if g.status == 0 {
		return false, nil
	}
	if g.status == 3 {
		s.sent = s.wait.handedAt(g.at)
	}
	s.token, s.fence, s.reentry = g.token, g.fence, g.status == 2
	s.keys = s.keys.permitKeys(g.permit)
	return true, nil
}

// acquireAndWait runs acquire.lua followed by WAIT: WAIT counts the writes of
// its own connection, so it must follow the script on the same one, a
// pipeline on a non-cluster client. Too few acknowledgements undo the acquire.
func (b *single) acquireAndWait(ctx context.Context, s *Lease, keys []string, args []any) grant {
	var wait *redis.IntCmd
	cmds, err := runPipelined(ctx, b.client, scriptAcquire, []scriptCall{{keys, args}}, func(p redis.Pipeliner) {
		wait = redis.NewIntCmd(ctx, "wait", b.replicas, b.replWait.Milliseconds())
		_ = p.Process(ctx, wait)
	})
	if err != nil {
		return grant{err: err}
	}
	reply, err := cmds[0].Result()
	g := parseGrant(0, s.token, reply, err)
	if g.err != nil || g.status != 1 {
		return g
	}
	err = wait.Err()
	if err == nil && wait.Val() < int64(b.replicas) {
		err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v",
			ErrReplicas, wait.Val(), b.replicas, b.replWait)
	}
	if err != nil {
		// Leave nothing behind: the lock we took is not safe to use.
		_, relErr := releaseOn(context.WithoutCancel(ctx), b.client, s.keys, g.token, s.owner, counterTTL(s.ttl, b.fenceTTL), s.ttl, s.limit)
		return grant{err: errors.Join(err, relErr)}
	}
	return g
}

// renew renews the leases on a single server (or Sentinel master) in batches
// of BatchSize per Lua call, all in one pipeline. On Redis Cluster the keys
// of different locks live in different slots, so each master gets one
// pipeline of single-lease renewals, all masters at once.
func (b *single) renew(ctx context.Context, leases []*Lease, results []error) {
	cc, ok := b.client.(*redis.ClusterClient)
	if !ok {
		statuses, errs := renewBatchOn(ctx, b.client, leases, b.fenceTTL)
		settleRenewals(leases, statuses, errs, results)
		return
	}
	byNode := map[*redis.Client][]int{}
	for i, s := range leases {
		node, err := cc.MasterForKey(ctx, s.keys.lock)
		if err != nil {
			results[i] = fmt.Errorf("lock: renew %q: %w", s.resource, err)
			continue
		}
		byNode[node] = append(byNode[node], i)
	}
	// A master that does not answer (killed, paused, cut off) must not hold
	// up the others until ctx's deadline, the deadline of the round's leases:
	// each node gets half the time left, so the other masters' answers are
	// applied while their leases are still trusted.
	nodeCtx := func() (context.Context, context.CancelFunc) { return ctx, func() {} }
	if d, ok := ctx.Deadline(); ok {
		budget := time.Until(d) / 2
		nodeCtx = func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, budget) }
	}
	var wg sync.WaitGroup
	for node, idx := range byNode {
		wg.Go(func() {
			ctx, cancel := nodeCtx()
			defer cancel()
			mine := make([]*Lease, len(idx))
			for n, i := range idx {
				mine[n] = leases[i]
			}
			statuses, errs := renewEachOn(ctx, node, mine, b.fenceTTL)
			out := make([]error, len(idx))
			settleRenewals(mine, statuses, errs, out)
			for n, i := range idx {
				results[i] = out[n]
			}
		})
	}
	wg.Wait()
}

// settleRenewals turns one node's renewal answers into results.
func settleRenewals(leases []*Lease, statuses []int64, errs []error, results []error) {
	for i, s := range leases {
		if errs[i] != nil {
			results[i] = fmt.Errorf("lock: renew %q: %w", s.resource, errs[i])
		} else if err := renewStatus(s, statuses[i]); err != nil {
			results[i] = err
		}
	}
}

// call runs script for one lock through bt, or alone when bt is nil.
func (b *single) call(ctx context.Context, bt *batcher, script *redis.Script, keys []string, args []any) (any, error) {
	if bt != nil {
		return bt.do(ctx, keys, args)
	}
	return run(ctx, b.client, script, keys, args...)
}

func (b *single) release(ctx context.Context, s *Lease) error {
	keys, args := releaseArgs(s.keys, s.token, s.owner, counterTTL(s.ttl, b.fenceTTL), s.ttl, s.limit)
	bt := b.releases
	if s.wait != nil && !s.wait.sent.IsZero() {
		// The lease waited in the queue: others likely wait behind it, and
		// the hand-off to them is their wait. Its call goes at once rather
		// than after a batch in flight (a round trip more on their wait).
		bt = nil
	}
	status, err := releaseStatus(b.call(ctx, bt, scriptRelease, keys, args))
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", s.resource, err)
	}
	return renewStatus(s, status)
}
