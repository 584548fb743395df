package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redlock is the state of a Locker made by NewRedlock: the same scripts, run
// on N independent masters, with a lease held while a quorum holds its token.
type redlock struct {
	nodes       []redis.UniversalClient
	quorum      int
	nodeTimeout time.Duration // 0: derived from the ttl, see timeout
	drift       time.Duration // 0: ttl/100 + 2ms
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
//   - WaitReplicas does not apply: the nodes are masters without replicas.
func NewRedlock(nodes []redis.UniversalClient, opts ...Option) *Locker {
	if len(nodes) == 0 || len(nodes)%2 == 0 {
		panic(fmt.Sprintf("lock: NewRedlock needs an odd number of nodes, got %d", len(nodes)))
	}
	for i, n := range nodes {
		if _, ok := n.(*redis.ClusterClient); ok {
			panic(fmt.Sprintf("lock: NewRedlock: node %d is a Cluster client; Redlock nodes are independent masters", i))
		}
	}
	rl := &redlock{nodes: nodes, quorum: len(nodes)/2 + 1}
	return New(nodes[0], append([]Option{func(l *Locker) { l.rl = rl }}, opts...)...)
}

// WithNodeTimeout bounds each node's part of a Redlock acquire and release,
// so that a dead node cannot eat the lease's validity. Default: ttl/20,
// within [50ms, 500ms]. It has no effect on a Locker made by New.
func WithNodeTimeout(d time.Duration) Option {
	return func(l *Locker) {
		if l.rl != nil {
			l.rl.nodeTimeout = d
		}
	}
}

// WithClockDrift sets the allowance for clock drift that a Redlock acquire
// subtracts from the lease's validity. Default: ttl/100 + 2ms. It has no
// effect on a Locker made by New.
func WithClockDrift(d time.Duration) Option {
	return func(l *Locker) {
		if l.rl != nil {
			l.rl.drift = d
		}
	}
}

// Nodes returns the Redis clients of the Locker: the Redlock nodes, or the
// one client of a Locker made by New.
func (l *Locker) Nodes() []redis.UniversalClient {
	if l.rl != nil {
		return l.rl.nodes
	}
	return []redis.UniversalClient{l.client}
}

// Quorum returns how many nodes must hold a lease: N/2+1 for Redlock, else 1.
func (l *Locker) Quorum() int {
	if l.rl != nil {
		return l.rl.quorum
	}
	return 1
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

// grant is one node's answer to acquire.lua.
type grant struct {
	node   int
	status int64 // 1 acquired, 2 re-entered, 0 busy
	token  string
	fence  int64
	err    error
}

// acquire runs acquire.lua on every node and keeps the lease when a quorum
// granted it. Like acquireOnce it returns (nil, nil) when the lock is busy.
func (r *redlock) acquire(ctx context.Context, l *Locker, s *Lease) (*Lease, error) {
	n, q := len(r.nodes), r.quorum
	timeout := r.timeout(s.ttl)
	keys := []string{s.keys.lock, s.keys.fence, s.keys.owners}
	args := []any{s.token, s.ttl.Milliseconds(), l.fenceTTL.Milliseconds(), s.owner}
	replies := make(chan grant, n)
	var wg sync.WaitGroup
	for i, c := range r.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			reply, err := run(nctx, c, scriptAcquire, keys, args...)
			replies <- parseGrant(i, reply, err)
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

	s.acquiring = &wg
	held := got // the grants to undo when the acquire fails
	if s.owner != "" {
		var ok bool
		if held, ok = r.settleReentrant(ctx, s, got); ok {
			return s, nil // re-entered a hold of a quorum: no new fence
		}
	}
	if len(filterGrants(held, 1)) >= q {
		err := r.fence(ctx, l, s, filterGrants(held, 1))
		if err == nil {
			if left := s.ttl - time.Since(s.sent) - r.driftFor(s.ttl); left > 0 {
				return s, nil
			}
			err = fmt.Errorf("%w: redlock: acquire took %v, no validity left of ttl %v", ErrNotAcquired, time.Since(s.sent).Round(time.Microsecond), s.ttl)
		}
		r.undo(ctx, &wg, s, held)
		return nil, err
	}
	r.undo(ctx, &wg, s, held)
	var errs []error
	for _, g := range got {
		if g.err != nil {
			errs = append(errs, g.err)
		}
	}
	if len(errs) > n-q {
		return nil, fmt.Errorf("redlock: %d of %d nodes failed, quorum %d: %w", len(errs), n, q, errors.Join(errs...))
	}
	return nil, nil
}

func parseGrant(node int, reply any, err error) grant {
	g := grant{node: node, err: err}
	if err != nil {
		g.err = fmt.Errorf("node %d: %w", node, err)
		return g
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) == 0 {
		g.err = fmt.Errorf("node %d: unexpected reply %v", node, reply)
		return g
	}
	g.status, _ = vals[0].(int64)
	if g.status == 1 || g.status == 2 {
		if len(vals) != 3 {
			g.status, g.err = 0, fmt.Errorf("node %d: unexpected reply %v", node, reply)
			return g
		}
		g.token, _ = vals[1].(string)
		g.fence, _ = vals[2].(int64)
	}
	return g
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
func (r *redlock) fence(ctx context.Context, l *Locker, s *Lease, granted []grant) error {
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
			v, err := run(nctx, r.nodes[g.node], scriptFenceRaise,
				[]string{s.keys.lock, s.keys.fence}, s.token, s.fence, l.fenceTTL.Milliseconds())
			if err == nil && v != int64(1) {
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
			v, err := run(nctx, r.nodes[g.node], scriptRelease, []string{k.lock, k.owners}, token, owner)
			if err != nil {
				errs[i] = fmt.Errorf("node %d: %w", g.node, err)
			}
			statuses[i], _ = v.(int64)
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
	if s.acquiring != nil {
		s.acquiring.Wait()
	}
	if err := s.state.err(); err != nil {
		if errors.Is(err, errReleased) {
			return nil
		}
		if !inferred(err) {
			return err
		}
		// Concluded locally (deadline, max hold): free what is still ours.
		_, errs := r.releaseOn(ctx, all, s.token, s.owner, s.keys, s.ttl)
		if relErr := errors.Join(errs...); relErr != nil {
			return errors.Join(err, fmt.Errorf("lock: release %q: %w", s.resource, relErr))
		}
		return err
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
		s.state.set(errReleased)
		return nil
	case gone > n-q:
		return s.state.set(&LostError{Key: s.resource, Reason: ReasonQuorumLost})
	}
	return fmt.Errorf("lock: release %q: redlock: released on %d of %d nodes, quorum %d: %w",
		s.resource, released, n, q, errors.Join(errs...))
}

// renew renews leases[live...] on every node at once, one pipeline per node,
// and decides each lease as soon as the answers allow: renewed when a quorum
// renewed it, lost (quorum_lost) when its token is gone from more than
// N − quorum nodes. It returns once every lease is decided or every node
// answered; the nodes still working go on in the background, bounded by
// ctx's deadline, so that a healthy but slower node is renewed too.
func (r *redlock) renew(ctx context.Context, leases []*Lease, live []int, results []error) {
	n, q := len(r.nodes), r.quorum
	type answer struct {
		statuses []int64 // per live lease; valid where errs is nil
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
			st, errs := renewOn(bg, c, leases, live)
			answers <- answer{st, errs}
		})
	}
	go func() { pending.Wait(); cancel() }()

	renewed := make([]int, len(live))
	gone := make([]int, len(live))
	errs := make([][]error, len(live))
	undecided := len(live)
	decided := make([]bool, len(live))
	for range n {
		if undecided == 0 {
			break
		}
		a := <-answers
		for k, i := range live {
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
				results[i] = nil
			case gone[k] > n-q:
				results[i] = leases[i].state.set(&LostError{Key: leases[i].resource, Reason: ReasonQuorumLost})
			default:
				continue
			}
			decided[k] = true
			undecided--
		}
	}
	for k, i := range live {
		if !decided[k] {
			results[i] = fmt.Errorf("lock: renew %q: redlock: renewed on %d of %d nodes, quorum %d: %w",
				leases[i].resource, renewed[k], n, q, errors.Join(errs[k]...))
		}
	}
}

// renewOn renews leases[live...] on one node with renew_batch.lua, batches of
// BatchSize in one pipeline, and returns the raw status of each (1 renewed,
// 0 expired, -1 another token) or its error.
func renewOn(ctx context.Context, c redis.UniversalClient, leases []*Lease, live []int) ([]int64, []error) {
	statuses, errs := make([]int64, len(live)), make([]error, len(live))
	type batch struct {
		from, to int // positions in live
		cmd      *redis.Cmd
	}
	var batches []batch
	send := func() {
		batches = batches[:0]
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for from := 0; from < len(live); from += BatchSize {
				to := min(from+BatchSize, len(live))
				keys := make([]string, 0, to-from)
				args := make([]any, 0, 3*(to-from))
				for _, i := range live[from:to] {
					s := leases[i]
					keys = append(keys, s.keys.lock)
					if s.owner != "" {
						keys = append(keys, s.keys.owners)
					}
					args = append(args, s.token, s.ttl.Milliseconds(), s.reentrantFlag())
				}
				batches = append(batches, batch{from, to, scriptRenewBatch.EvalSha(ctx, p, keys, args...)})
			}
			return nil
		})
	}
	send()
	if err := batches[0].cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := scriptRenewBatch.Load(ctx, c).Err(); err != nil {
			for k := range errs {
				errs[k] = fmt.Errorf("load script: %w", err)
			}
			return statuses, errs
		}
		send()
	}
	for _, b := range batches {
		vals, err := b.cmd.Slice()
		if err == nil && len(vals) != b.to-b.from {
			err = fmt.Errorf("renew_batch returned %d statuses for %d leases", len(vals), b.to-b.from)
		}
		for k := b.from; k < b.to; k++ {
			if err != nil {
				errs[k] = err
				continue
			}
			statuses[k], _ = vals[k-b.from].(int64)
		}
	}
	return statuses, errs
}
