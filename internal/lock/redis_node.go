package lock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operations on one Redis node (a server, a Cluster slot's master, or a
// Redlock node) that the Redis back ends are made of: acquire, renew a batch,
// release and raise a fence. Each is one script; the statuses are the
// scripts' return values (see their headers in lua/).

// grant is one node's answer to acquire.lua for one lock.
type grant struct {
	node   int
	status int64 // 1 acquired, 2 re-entered, 3 handed to the waiter earlier, 0 busy
	token  string
	fence  int64
	at     int64 // server time in µs: of a hand-off (3), or of a waiter's busy attempt (0)
	permit int   // the permit taken (0: the lock itself)
	err    error
}

// counterTTL is the TTL, in milliseconds, that every script taking or
// renewing a lock of ttl gives its fencing counter: the lock lives at most ttl
// after that, so the counter outlives it by at least fenceTTL (WithFenceTTL).
func counterTTL(ttl, fenceTTL time.Duration) int64 { return (ttl + fenceTTL).Milliseconds() }

func acquireArgs(s *Lease, fenceTTL time.Duration) ([]string, []any) {
	return []string{s.keys.lock, s.keys.fence, s.keys.owners, s.keys.queue, s.keys.floor},
		[]any{s.token, s.ttl.Milliseconds(), counterTTL(s.ttl, fenceTTL), s.owner, s.waiterID(), s.limit}
}

// parseGrant reads acquire.lua's reply for one lock, taken with token.
func parseGrant(node int, token string, reply any, err error) grant {
	g := grant{node: node, err: err}
	if err != nil {
		return g
	}
	switch v := reply.(type) {
	case int64:
		if v > 0 {
			g.status, g.token, g.fence = 1, token, v
		}
		return g
	case string: // a hand-off: "fence|at|token"
		if parseHandoff(&g, v) {
			return g
		}
	case []any:
		if len(v) == 3 { // a permit k > 0: {fence, k, "p"} afresh, {token, fence, k} re-entered
			if f, ok := v[0].(int64); ok && f > 0 {
				k, _ := v[1].(int64)
				g.status, g.token, g.fence, g.permit = 1, token, f, int(k)
				return g
			}
			g.token, _ = v[0].(string)
			g.fence, _ = v[1].(int64)
			k, _ := v[2].(int64)
			if g.token != "" && k > 0 {
				g.status, g.permit = 2, int(k)
				return g
			}
		}
		if len(v) == 2 {
			if busy, ok := v[0].(int64); ok && busy == 0 { // a waiter's busy attempt: {0, now}
				g.at, _ = v[1].(int64)
				return g
			}
			g.token, _ = v[0].(string)
			g.fence, _ = v[1].(int64)
			if g.token != "" {
				g.status = 2
				return g
			}
		}
	}
	g.err = fmt.Errorf("unexpected reply %v", reply)
	return g
}

// parseHandoff reads a hand-off "fence|at|token" (acquire.lua), or
// "fence|at:k|token" of permit k > 0, into g.
func parseHandoff(g *grant, v string) bool {
	f, rest, ok1 := strings.Cut(v, "|")
	at, token, ok2 := strings.Cut(rest, "|")
	k := 0
	if a, p, ok := strings.Cut(at, ":"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return false
		}
		at, k = a, n
	}
	fence, err1 := strconv.ParseInt(f, 10, 64)
	t, err2 := strconv.ParseInt(at, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || token == "" {
		return false
	}
	g.status, g.token, g.fence, g.at, g.permit = 3, token, fence, t, k
	return true
}

// releaseArgs: counter is the counter's TTL (counterTTL) should the release
// hand the lock to a waiter; ttl is the lock ttl of a grant to a parked task;
// limit the one the lease's acquire declared (1 for a lock; a permit's
// release needs no look at the limit while nobody waits).
func releaseArgs(k keys, token, owner string, counter int64, ttl time.Duration, limit int) ([]string, []any) {
	return []string{k.lock, k.fence, k.owners, k.queue, k.floor}, []any{token, owner, counter, ttl.Milliseconds(), k.permit, max(limit, 1)}
}

// releaseStatus reads release.lua's reply for one lock: 1 released, 2 one
// reentrant hold given back, 0 the key is gone, -1 another token holds it.
func releaseStatus(reply any, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	st, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected reply %v", reply)
	}
	return st, nil
}

// releaseOn runs release.lua for token and owner on c (see releaseStatus).
func releaseOn(ctx context.Context, c redis.Scripter, k keys, token, owner string, counter int64, ttl time.Duration, limit int) (int64, error) {
	keys, args := releaseArgs(k, token, owner, counter, ttl, limit)
	return releaseStatus(run(ctx, c, scriptRelease, keys, args...))
}

// raiseFenceOn lifts c's fencing counter of s to fence while c holds s's
// token (fence_raise.lua): true when it did, false when the token is gone.
func raiseFenceOn(ctx context.Context, c redis.Scripter, s *Lease, fence int64, fenceTTL time.Duration) (bool, error) {
	v, err := run(ctx, c, scriptFenceRaise, []string{s.keys.lock, s.keys.fence}, s.token, fence, counterTTL(s.ttl, fenceTTL))
	return v == int64(1), err
}

// renewBatchOn renews leases on one node with renew_batch.lua, BatchSize
// leases per call, every call in one pipeline; each renewed lock's fencing
// counter gets counterTTL again. It returns each lease's status (1 renewed,
// 0 expired, -1 another token) or its error.
func renewBatchOn(ctx context.Context, c redis.Cmdable, leases []*Lease, fenceTTL time.Duration) ([]int64, []error) {
	statuses, errs := make([]int64, len(leases)), make([]error, len(leases))
	var calls []scriptCall
	for from := 0; from < len(leases); from += BatchSize {
		to := min(from+BatchSize, len(leases))
		keys := make([]string, 0, 2*(to-from))
		args := make([]any, 0, 4*(to-from))
		for _, s := range leases[from:to] {
			keys = append(keys, s.keys.lock, s.keys.fence)
			if s.owner != "" {
				keys = append(keys, s.keys.owners)
			}
			if s.keys.permit > 0 {
				keys = append(keys, s.keys.limitKey())
			}
			flags := s.renewFlags()
			if g := s.progressFlag(); g != "" {
				keys, flags = append(keys, s.keys.progressKey()), flags+g
			}
			args = append(args, s.token, s.ttl.Milliseconds(), flags, counterTTL(s.ttl, fenceTTL))
		}
		calls = append(calls, scriptCall{keys, args})
	}
	cmds, err := runPipelined(ctx, c, scriptRenewBatch, calls, nil)
	for n, from := 0, 0; from < len(leases); n, from = n+1, from+BatchSize {
		to := min(from+BatchSize, len(leases))
		bErr := err
		var vals []any
		if bErr == nil {
			vals, bErr = cmds[n].Slice()
		}
		if bErr == nil && len(vals) != to-from {
			bErr = fmt.Errorf("renew_batch returned %d statuses for %d leases", len(vals), to-from)
		}
		for k := from; k < to; k++ {
			if bErr != nil {
				errs[k] = bErr
			} else {
				statuses[k], _ = vals[k-from].(int64)
			}
		}
	}
	return statuses, errs
}

// renewEachOn renews leases on one node with one renew.lua call each, all in
// one pipeline: for a Cluster master, whose leases' keys live in different
// slots. It returns what renewBatchOn does.
func renewEachOn(ctx context.Context, c redis.Cmdable, leases []*Lease, fenceTTL time.Duration) ([]int64, []error) {
	statuses, errs := make([]int64, len(leases)), make([]error, len(leases))
	calls := make([]scriptCall, len(leases))
	for i, s := range leases {
		keys := []string{s.keys.lock, s.keys.owners, s.keys.fence}
		if s.keys.permit > 0 {
			keys = append(keys, s.keys.limitKey())
		}
		g := s.progressFlag()
		if g != "" {
			keys = append(keys, s.keys.progressKey())
		}
		calls[i] = scriptCall{keys, []any{s.token, s.ttl.Milliseconds(), s.reentrantFlag(), counterTTL(s.ttl, fenceTTL), g}}
	}
	cmds, err := runPipelined(ctx, c, scriptRenew, calls, nil)
	for i := range leases {
		if err != nil {
			errs[i] = err
			continue
		}
		v, err := cmds[i].Result()
		if err != nil {
			errs[i] = err
			continue
		}
		statuses[i], _ = v.(int64)
	}
	return statuses, errs
}

// renewStatus turns a renew or release status into a lease's result: nil when
// held (1, or 2 for a reentrant release), a *LostError for 0 (expired) and -1
// (stolen).
func renewStatus(s *Lease, status int64) error {
	switch status {
	case 1, 2:
		return nil
	case 0:
		return s.lost(ReasonExpired)
	case -1:
		return s.lost(ReasonStolen)
	}
	return fmt.Errorf("lock: %q: unexpected status %d", s.resource, status)
}
