package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// BatchSize is how many leases one renew_batch script call renews. A call
// blocks Redis for its duration, so batches stay small enough (~1,000 leases,
// well under a millisecond of server time) not to delay other clients.
const BatchSize = 1000

// RenewAll renews many leases of this Locker in a few round trips and returns
// one result per lease, in order: nil when renewed, an error matching
// ErrLockLost when the lock is no longer ours (the lease is marked lost), or
// the transport error that kept the renewal from happening.
//
// On a single server (or a Sentinel-managed master) the leases go in batches
// of BatchSize through one Lua call each, all batches in one pipeline. On
// Redis Cluster the keys of different locks live in different slots, so each
// master node gets one pipeline of single-lease renewals. For Redlock, every
// node gets the batches of the single-server case, and a lease stays held
// while a quorum renews it.
func (l *Locker) RenewAll(ctx context.Context, leases []*Lease) []error {
	results := make([]error, len(leases))
	live := make([]int, 0, len(leases))
	for i, s := range leases {
		if err := s.state.err(); err != nil {
			results[i] = err
			continue
		}
		live = append(live, i)
	}
	if len(live) == 0 {
		return results
	}
	if l.rl != nil {
		l.rl.renew(ctx, leases, live, results)
		return results
	}
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		l.renewCluster(ctx, cc, leases, live, results)
		return results
	}
	l.renewBatched(ctx, l.client, leases, live, results)
	return results
}

// renewBatched renews leases[live...] on one node with renew_batch.lua.
func (l *Locker) renewBatched(ctx context.Context, c redis.UniversalClient, leases []*Lease, live []int, results []error) {
	type batch struct {
		idx []int
		cmd *redis.Cmd
	}
	var batches []batch
	send := func() {
		batches = batches[:0]
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for start := 0; start < len(live); start += BatchSize {
				idx := live[start:min(start+BatchSize, len(live))]
				keys := make([]string, 0, len(idx)+1)
				args := make([]any, 0, 3*len(idx))
				for _, i := range idx {
					s := leases[i]
					keys = append(keys, s.keys.lock)
					if s.owner != "" {
						keys = append(keys, s.keys.owners)
					}
					args = append(args, s.token, s.ttl.Milliseconds(), s.reentrantFlag())
				}
				batches = append(batches, batch{idx, scriptRenewBatch.EvalSha(ctx, p, keys, args...)})
			}
			return nil
		})
	}
	send()
	// A pipeline can only send EVALSHA; after a restart or failover the
	// script is missing once: load it and send again.
	if err := batches[0].cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := scriptRenewBatch.Load(ctx, c).Err(); err != nil {
			for _, i := range live {
				results[i] = fmt.Errorf("lock: renew %q: load script: %w", leases[i].resource, err)
			}
			return
		}
		send()
	}
	for _, b := range batches {
		statuses, err := b.cmd.Slice()
		if err == nil && len(statuses) != len(b.idx) {
			err = fmt.Errorf("renew_batch returned %d statuses for %d leases", len(statuses), len(b.idx))
		}
		for n, i := range b.idx {
			if err != nil {
				results[i] = fmt.Errorf("lock: renew %q: %w", leases[i].resource, err)
				continue
			}
			results[i] = leases[i].settle(statuses[n])
		}
	}
}

// renewCluster sends one pipeline per master node, concurrently.
func (l *Locker) renewCluster(ctx context.Context, cc *redis.ClusterClient, leases []*Lease, live []int, results []error) {
	byNode := map[*redis.Client][]int{}
	for _, i := range live {
		node, err := cc.MasterForKey(ctx, leases[i].keys.lock)
		if err != nil {
			results[i] = fmt.Errorf("lock: renew %q: %w", leases[i].resource, err)
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
			cmds := make([]*redis.Cmd, len(idx))
			send := func() {
				_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
					for n, i := range idx {
						s := leases[i]
						cmds[n] = scriptRenew.EvalSha(ctx, p, []string{s.keys.lock, s.keys.owners},
							s.token, s.ttl.Milliseconds(), s.reentrantFlag())
					}
					return nil
				})
			}
			send()
			if err := cmds[0].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				if err := scriptRenew.Load(ctx, node).Err(); err != nil {
					for _, i := range idx {
						results[i] = fmt.Errorf("lock: renew %q: load script: %w", leases[i].resource, err)
					}
					return
				}
				send()
			}
			for n, i := range idx {
				if reply, err := cmds[n].Result(); err != nil {
					results[i] = fmt.Errorf("lock: renew %q: %w", leases[i].resource, err)
				} else {
					results[i] = leases[i].settle(reply)
				}
			}
		})
	}
	wg.Wait()
}
