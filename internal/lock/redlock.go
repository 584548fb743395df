package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redlock is the back end of NewRedlock: the scripts of the single back end,
// run on N independent masters, with a lease held while a quorum holds its
// token.
type redlock struct {
	nodes       []redis.UniversalClient
	quorum      int
	fenceTTL    time.Duration
	nodeTimeout time.Duration // 0: derived from the ttl, see timeout
	drift       time.Duration // 0: ttl/100 + 2ms
}

func (*redlock) options() []string { return []string{optFenceTTL, optNodeTimeout, optClockDrift} }

// redlockLease is a Redlock lease's own state.
type redlockLease struct {
	acquiring *sync.WaitGroup // node answers to the acquire still on their way
}

// NewRedlock returns a Locker whose leases are held on a quorum (N/2+1) of
// nodes, independent Redis masters that share nothing (no replication, no
// Cluster between them). N must be odd; 5 is the usual choice, tolerating 2
// failed nodes. It panics when N is even or 0, or a node is a Cluster
// client: both are programming errors, which configuration loading rejects.
//
// Leases have the same API and keys as those of New: Acquire, TryAcquire,
// Renew, Release, RenewAll and the watchdog work unchanged. Differences:
//
//   - Acquire tries every node at once, each bounded by the node timeout
//     (WithNodeTimeout), and succeeds when a quorum granted it with validity
//     left: ttl − elapsed − drift > 0 (WithClockDrift). Otherwise it releases
//     on every node. It answers ErrNotAcquired when the lock is busy (or the
//     acquire ran out of validity), and a transport error when too many
//     nodes failed for a quorum to be possible.
//   - Renewal keeps a lease while a quorum renews it. It is lost, with reason
//     quorum_lost, when its token is gone from more than N − quorum nodes.
//     Other outcomes (nodes unreachable) are transport errors: the watchdog
//     retries until its local deadline, then reports unreachable.
//   - Release deletes the token on every node.
//   - Fences are explained in the package documentation.
//   - WaitReplicas does not apply (the nodes are masters without replicas)
//     and, like any option that does not apply, makes NewRedlock panic.
func NewRedlock(nodes []redis.UniversalClient, opts ...Option) *Locker {
	if len(nodes) == 0 || len(nodes)%2 == 0 {
		panic(fmt.Sprintf("lock: NewRedlock needs an odd number of nodes, got %d", len(nodes)))
	}
	for i, n := range nodes {
		if _, ok := n.(*redis.ClusterClient); ok {
			panic(fmt.Sprintf("lock: NewRedlock: node %d is a Cluster client; Redlock nodes are independent masters", i))
		}
	}
	st := newSettings(opts)
	rl := &redlock{nodes: nodes, quorum: len(nodes)/2 + 1, fenceTTL: st.fenceTTL, nodeTimeout: st.nodeTimeout, drift: st.drift}
	l, err := newLocker("redlock", st, rl)
	if err != nil {
		panic(err.Error())
	}
	return l
}

// WithNodeTimeout bounds each node's part of a Redlock acquire and release,
// so that a dead node cannot eat the lease's validity. Default: ttl/20,
// within [50ms, 500ms]. Redlock only.
func WithNodeTimeout(d time.Duration) Option {
	return option(optNodeTimeout, func(s *settings) { s.nodeTimeout = d })
}

// WithClockDrift sets the allowance for clock drift that a Redlock acquire
// subtracts from the lease's validity. Default: ttl/100 + 2ms. Redlock only.
func WithClockDrift(d time.Duration) Option {
	return option(optClockDrift, func(s *settings) { s.drift = d })
}

// nodes is implemented by the Redis back ends.
type nodeLister interface {
	redisNodes() []redis.UniversalClient
	quorumSize() int
}

func (r *redlock) redisNodes() []redis.UniversalClient { return r.nodes }
func (r *redlock) quorumSize() int                     { return r.quorum }
func (b *single) redisNodes() []redis.UniversalClient  { return []redis.UniversalClient{b.client} }
func (b *single) quorumSize() int                      { return 1 }

// Nodes returns the Redis clients of the Locker: the Redlock nodes, or the
// one client of a Locker made by New; none for etcd.
func (l *Locker) Nodes() []redis.UniversalClient {
	if n, ok := l.be.(nodeLister); ok {
		return n.redisNodes()
	}
	return nil
}

// Quorum returns how many Redis nodes must hold a lease: N/2+1 for Redlock,
// 1 for New, 0 for etcd (whose own quorum is the cluster's business).
func (l *Locker) Quorum() int {
	if n, ok := l.be.(nodeLister); ok {
		return n.quorumSize()
	}
	return 0
}

func (r *redlock) timeout(ttl time.Duration) time.Duration {
	if r.nodeTimeout > 0 {
		return r.nodeTimeout
	}
	return min(max(ttl/20, 50*time.Millisecond), 500*time.Millisecond)
}

func (r *redlock) driftFor(ttl time.Duration) time.Duration {
	if r.drift > 0 {
		return r.drift
	}
	return ttl/100 + 2*time.Millisecond
}

// acquire runs acquire.lua on every node and keeps the lease when a quorum
// granted it; it reports false when the lock is busy.
func (r *redlock) acquire(ctx context.Context, s *Lease) (bool, error) {
	n, q := len(r.nodes), r.quorum
	timeout := r.timeout(s.ttl)
	keys, args := acquireArgs(s, r.fenceTTL)
	replies := make(chan grant, n)
	var wg sync.WaitGroup
	for i, c := range r.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			reply, err := run(nctx, c, scriptAcquire, keys, args...)
			g := parseGrant(i, s.token, reply, err)
			if g.err != nil {
				g.err = fmt.Errorf("node %d: %w", i, g.err)
			}
			replies <- g
		})
	}

	// A plain acquire is decided as soon as a quorum granted it, or too few
	// nodes are left to; the others finish in the background, bounded by the
	// node timeout (a late grant is ours: renewal and release cover every
	// node). A reentrant one hears every node, to undo exactly what it did.
	var got []grant
	acquired, failed := 0, 0
	for len(got) < n {
		g := <-replies
		got = append(got, g)
		if g.status == 1 {
			acquired++
		} else if g.status == 0 {
			failed++
		}
		if s.owner == "" && (acquired >= q || n-failed < q) {
			break
		}
	}

	s.ext = &redlockLease{acquiring: &wg}
	held := got // the grants to undo when the acquire fails
	if s.owner != "" {
		var ok bool
		if held, ok = r.settleReentrant(ctx, s, got); ok {
			return true, nil // re-entered a hold of a quorum: no new fence
		}
	}
	if len(filterGrants(held, 1)) >= q {
		err := r.fence(ctx, s, filterGrants(held, 1))
		if err == nil {
			if left := s.ttl - time.Since(s.sent) - r.driftFor(s.ttl); left > 0 {
				return true, nil
			}
			err = fmt.Errorf("%w: redlock: acquire took %v, no validity left of ttl %v", ErrNotAcquired, time.Since(s.sent).Round(time.Microsecond), s.ttl)
		}
		r.undo(ctx, &wg, s, held)
		return false, err
	}
	r.undo(ctx, &wg, s, held)
	var errs []error
	for _, g := range got {
		if g.err != nil {
			errs = append(errs, g.err)
		}
	}
	if len(errs) > n-q {
		return false, fmt.Errorf("redlock: %d of %d nodes failed, quorum %d: %w", len(errs), n, q, errors.Join(errs...))
	}
	return false, nil
}

func filterGrants(gs []grant, status int64) []grant {
	var out []grant
	for _, g := range gs {
		if g.status == status && g.err == nil {
			out = append(out, g)
		}
	}
	return out
}

// settleReentrant decides a reentrant acquire from every node's answer. When
// a quorum re-entered one holder's token, the lease joins that hold (its
// token, its fence) and the fresh grants are undone; it reports ok. Otherwise
// the re-entries are undone and it returns the fresh grants.
func (r *redlock) settleReentrant(ctx context.Context, s *Lease, got []grant) ([]grant, bool) {
	byToken := map[string][]grant{}
	for _, g := range filterGrants(got, 2) {
		byToken[g.token] = append(byToken[g.token], g)
	}
	for token, gs := range byToken {
		if len(gs) < r.quorum {
			continue
		}
		r.releaseOn(ctx, filterGrants(got, 1), s.token, s.owner, s.keys, s.ttl)
		for _, g := range gs {
			s.fence = max(s.fence, g.fence) // a quorum includes a node the fence was raised on
		}
		s.token, s.reentry = token, true
		return nil, true
	}
	for token, gs := range byToken {
		r.releaseOn(ctx, gs, token, s.owner, s.keys, s.ttl) // one hold count back on each
	}
	return filterGrants(got, 1), false
}

// fence gives the lease the highest counter among the nodes that granted it,
// and lifts the lower counters of those nodes to it (fence_raise.lua). The
// fence stands when a quorum of granting nodes has its counter at the fence
// while holding the token.
func (r *redlock) fence(ctx context.Context, s *Lease, granted []grant) error {
	for _, g := range granted {
		s.fence = max(s.fence, g.fence)
	}
	confirmed := 0
	var lower []grant
	for _, g := range granted {
		if g.fence == s.fence {
			confirmed++
		} else {
			lower = append(lower, g)
		}
	}
	if confirmed >= r.quorum {
		return nil
	}
	raised := make(chan error, len(lower))
	for _, g := range lower {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, r.timeout(s.ttl))
			defer cancel()
			ok, err := raiseFenceOn(nctx, r.nodes[g.node], s, s.fence, r.fenceTTL)
			if err == nil && !ok {
				err = fmt.Errorf("node %d no longer holds the token", g.node)
			}
			raised <- err
		}()
	}
	var errs []error
	for range lower {
		if err := <-raised; err != nil {
			errs = append(errs, err)
		} else {
			confirmed++
		}
	}
	if confirmed >= r.quorum {
		return nil
	}
	return fmt.Errorf("%w: redlock: fence %d confirmed on %d nodes, quorum %d: %w",
		ErrNotAcquired, s.fence, confirmed, r.quorum, errors.Join(errs...))
}

// undo gives up a failed acquire: it waits for every node's answer (each is
// bounded by the node timeout), so that no late grant lands after the
// release, then releases the token on every node that may hold it.
func (r *redlock) undo(ctx context.Context, wg *sync.WaitGroup, s *Lease, held []grant) {
	wg.Wait()
	for _, g := range held {
		if g.status == 2 { // a re-entry left over: give its hold count back
			r.releaseOn(ctx, []grant{g}, g.token, s.owner, s.keys, s.ttl)
		}
	}
	all := make([]grant, len(r.nodes))
	for i := range all {
		all[i] = grant{node: i}
	}
	r.releaseOn(ctx, all, s.token, s.owner, s.keys, s.ttl)
}

// releaseOn runs release.lua for token on the nodes of gs, at once, and
// returns each node's status (or error) in the order of gs.
func (r *redlock) releaseOn(ctx context.Context, gs []grant, token, owner string, k keys, ttl time.Duration) ([]int64, []error) {
	ctx = context.WithoutCancel(ctx) // leave nothing behind, even when the caller gave up
	statuses, errs := make([]int64, len(gs)), make([]error, len(gs))
	var wg sync.WaitGroup
	for i, g := range gs {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, r.timeout(ttl))
			defer cancel()
			st, err := releaseOn(nctx, r.nodes[g.node], k, token, owner, counterTTL(ttl, r.fenceTTL), ttl, 1)
			if err != nil {
				errs[i] = fmt.Errorf("node %d: %w", g.node, err)
			}
			statuses[i] = st
		})
	}
	wg.Wait()
	return statuses, errs
}

// release deletes the lease's token on every node. It reports the lease
// released when a quorum released it, lost (quorum_lost) when the token was
// gone from more than N − quorum nodes, and otherwise the nodes' errors.
func (r *redlock) release(ctx context.Context, s *Lease) error {
	all := make([]grant, len(r.nodes))
	for i := range all {
		all[i] = grant{node: i}
	}
	// A grant still on its way would land after the release and block its
	// node until the ttl passes: wait for it (bounded by the node timeout).
	if e, ok := s.ext.(*redlockLease); ok {
		e.acquiring.Wait()
	}
	statuses, errs := r.releaseOn(ctx, all, s.token, s.owner, s.keys, s.ttl)
	released, gone := 0, 0
	for i, st := range statuses {
		switch {
		case errs[i] != nil:
		case st == 1 || st == 2:
			released++
		default:
			gone++
		}
	}
	n, q := len(r.nodes), r.quorum
	switch {
	case released >= q:
		return nil
	case gone > n-q:
		return s.lost(ReasonQuorumLost)
	}
	return fmt.Errorf("lock: release %q: redlock: released on %d of %d nodes, quorum %d: %w",
		s.resource, released, n, q, errors.Join(errs...))
}

// renew renews the leases on every node at once, one pipeline of batches per
// node, and decides each lease as soon as the answers allow: renewed when a
// quorum renewed it, lost (quorum_lost) when its token is gone from more than
// N − quorum nodes. It returns once every lease is decided or every node
// answered; the nodes still working go on in the background, bounded by
// ctx's deadline, so that a healthy but slower node is renewed too.
func (r *redlock) renew(ctx context.Context, leases []*Lease, results []error) {
	n, q := len(r.nodes), r.quorum
	type answer struct {
		statuses []int64 // per lease; valid where errs is nil
		errs     []error
	}
	bg, cancel := context.WithoutCancel(ctx), context.CancelFunc(nil)
	if d, ok := ctx.Deadline(); ok {
		bg, cancel = context.WithDeadline(bg, d)
	} else {
		bg, cancel = context.WithCancel(bg)
	}
	answers := make(chan answer, n)
	var pending sync.WaitGroup
	for _, c := range r.nodes {
		pending.Go(func() {
			st, errs := renewBatchOn(bg, c, leases, r.fenceTTL)
			answers <- answer{st, errs}
		})
	}
	go func() { pending.Wait(); cancel() }()

	renewed := make([]int, len(leases))
	gone := make([]int, len(leases))
	errs := make([][]error, len(leases))
	undecided := len(leases)
	decided := make([]bool, len(leases))
	for range n {
		if undecided == 0 {
			break
		}
		a := <-answers
		for k, s := range leases {
			if decided[k] {
				continue
			}
			switch {
			case a.errs[k] != nil:
				errs[k] = append(errs[k], a.errs[k])
			case a.statuses[k] == 1:
				renewed[k]++
			default:
				gone[k]++
			}
			switch {
			case renewed[k] >= q:
				results[k] = nil
			case gone[k] > n-q:
				results[k] = s.lost(ReasonQuorumLost)
			default:
				continue
			}
			decided[k] = true
			undecided--
		}
	}
	for k, s := range leases {
		if !decided[k] {
			results[k] = fmt.Errorf("lock: renew %q: redlock: renewed on %d of %d nodes, quorum %d: %w",
				s.resource, renewed[k], n, q, errors.Join(errs[k]...))
		}
	}
}
