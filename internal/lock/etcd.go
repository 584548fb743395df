package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockstep-dev/lockstep/internal/backoff"
)

// etcdBackend is the back end of NewEtcd: locks are etcd keys bound to etcd
// leases, fences are the revisions that wrote them.
//
// Why not etcd's concurrency package (Session, Mutex): a Session keeps its
// lease alive from its own goroutine and reports loss only when that
// keep-alive gives up, which can be long after the lease expired on the
// server; nothing in it knows the send time of the last keep-alive that
// succeeded, so a holder cut off from etcd would go on past its lease. The
// watchdog's local deadline (last renewal's send time + ttl − drift) needs
// renewal driven by the watchdog, one round for many leases, which is what
// this back end gives it. Mutex also has no reentrancy and one TTL per
// Session. The ideas are the same: a lease per holder, a key created only if
// absent, the revision as the fence, and the waiter queue (etcd_queue.go):
// places in line ordered by their keys' create revisions, each waiter
// watching the one just ahead.
type etcdBackend struct {
	cl          EtcdClient
	watchPrefix string // every lock key starts with it

	mu       sync.Mutex
	leases   map[int64]*etcdShared   // by TTL in seconds: the lease new locks join
	held     map[string][]*Lease     // lock key -> leases held on it, for the watch
	handoffs map[string]*etcdHanding // resource's lock key -> its hand-offs' turn (handOn)
	notify   []func(*Lease, error)
	watchOn  bool
	closed   bool
	done     chan struct{} // closed by close: ends a waiter's leave that retries (etcd_queue.go)
	stop     context.CancelFunc
	stopped  chan struct{}
}

// etcdShared is one etcd lease that the locks of one TTL (in whole seconds)
// acquired by this Locker share, as the locks of a concurrency.Session do:
// an acquire costs one transaction, not a grant, a transaction and a revoke,
// and a renewal round one keep-alive per lease, not per lock.
type etcdShared struct {
	id  int64
	ttl int64 // seconds, as granted

	mu    sync.Mutex
	alive time.Time // send time of the grant or of the last keep-alive that succeeded
}

func (e *etcdShared) aliveAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.alive
}

func (e *etcdShared) renewedAt(sent time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sent.After(e.alive) {
		e.alive = sent
	}
}

// NewEtcd returns a Locker whose leases live in an etcd cluster (the etcd
// back end). A lock on resource R is the key P{R} (the same name as on Redis),
// created in a transaction only if absent and bound to an etcd lease of the
// lock's TTL rounded up to whole seconds; its value is the holder's token.
// Differences from New:
//
//   - Fence is the revision that wrote the key (its create, or a release's
//     hand-off to a waiter): etcd's revision counter only grows, across
//     restarts of holders and of etcd members, so fences strictly increase
//     per resource (and across resources) without a counter key.
//     WithFenceTTL does not apply.
//   - An etcd lease counts whole seconds, and the server raises a TTL below
//     its minimum (1.5 × election timeout, 2s by default): a crashed holder's
//     lock frees after that long, not after the lock's ttl. The holder's
//     local deadline still uses the lock's ttl, so it stops early, never late.
//   - Loss is noticed at once through a watch on the lock keys (key deleted:
//     expired; key overwritten: stolen); see Locker.NotifyLoss. Renewal (a
//     keep-alive of the lease and a read of the key) stays the authority. The
//     watch asks its member for a progress notice every 100ms and moves to
//     another member when one goes unanswered (a paused or cut-off member
//     fails no call by itself).
//   - The locks of one TTL share one etcd lease per Locker, as the locks of a
//     concurrency.Session do. A lease is joined only while its last
//     keep-alive is recent (within half the ttl); the new lock's AcquiredAt
//     is then that keep-alive's send time, so the local deadline never
//     outlives the key.
//   - Each call to etcd is bounded by the lock's ttl (at least 1s) when ctx
//     has no earlier deadline: a cluster without quorum answers with an
//     error, not a hang. A renewal's keep-alives and key reads are hedged:
//     while a copy goes unanswered, another goes to the next member, so a
//     paused or cut-off member (the old leader, say) slows a round by a
//     fraction of it instead of failing it.
//   - A leader paused past the TTL may revoke the leases on resuming (etcd
//     3.4.23, etcd issue 15247); the watch cancels their holders (expired).
//   - Permits: permit k > 0 of R is the key P{R}:p<k> (permit 0 is P{R}),
//     held like a lock, its fence the revision that wrote it. An acquire takes
//     the lowest free permit below its limit in a transaction that fails
//     if the permits changed since the read it chose from in a way that
//     could break the limit, so the limit holds under concurrent acquires.
//     P{R}:limit holds the latest declared limit, on its declarer's lease,
//     until the last permit is released.
//   - Waiting Acquires of every process hold places in one queue per
//     resource in etcd, in the order of their keys' create revisions, and a
//     release hands the permit to the first (etcd_queue.go). TryAcquire is
//     busy while anyone waits.
//   - WaitReplicas, WithNodeTimeout and WithClockDrift do not apply, and
//     like any option that does not apply make NewEtcd panic.
//
// Call Close when done: it stops the watch. The client stays the caller's.
func NewEtcd(client EtcdClient, opts ...Option) *Locker {
	st := newSettings(opts)
	be := &etcdBackend{
		cl:          client,
		watchPrefix: st.prefix + "{",
		leases:      map[int64]*etcdShared{},
		held:        map[string][]*Lease{},
		handoffs:    map[string]*etcdHanding{},
		done:        make(chan struct{}),
	}
	l, err := newLocker("etcd", st, be)
	if err != nil {
		panic(err.Error())
	}
	return l
}

func (*etcdBackend) options() []string { return nil }

// etcdLease is an etcd lease's own state.
type etcdLease struct {
	shared *etcdShared // nil for a re-entry into a hold taken elsewhere
	id     int64
	// contended: the acquire found others in line (or was handed the
	// permit), so the release reads the queue first to hand the permit on;
	// otherwise it deletes the key if still no one waits, one transaction,
	// and reads the queue only when someone does.
	contended bool
	handedTo  string // the token its release tried to hand the permit to
}

func callCtx(ctx context.Context, ttl time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(ttl, time.Second))
}

func ttlSeconds(ttl time.Duration) int64 {
	return max(int64((ttl+time.Second-1)/time.Second), 1)
}

// leaseFor returns the shared lease for ttl, granting a new one when there is
// none or its last keep-alive is older than half the ttl (it may be about to
// expire: no holder renews it).
func (b *etcdBackend) leaseFor(ctx context.Context, ttl time.Duration) (*etcdShared, error) {
	secs := ttlSeconds(ttl)
	b.mu.Lock()
	sh := b.leases[secs]
	b.mu.Unlock()
	if sh != nil && time.Since(sh.aliveAt()) < ttl/2 {
		return sh, nil
	}
	sent := time.Now()
	id, granted, err := b.cl.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("etcd: grant lease: %w", err)
	}
	sh = &etcdShared{id: id, ttl: granted, alive: sent}
	b.mu.Lock()
	b.leases[secs] = sh
	b.mu.Unlock()
	return sh, nil
}

// forget drops sh as the lease new locks join (the server no longer has it).
func (b *etcdBackend) forget(sh *etcdShared) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range b.leases {
		if v == sh {
			delete(b.leases, k)
		}
	}
}

// owners value: "<hold count> <owner id>".
func ownersValue(n int, owner string) string { return strconv.Itoa(n) + " " + owner }

func parseOwners(v []byte) (int, string) {
	n, owner, ok := strings.Cut(string(v), " ")
	count, err := strconv.Atoi(n)
	if !ok || err != nil {
		return 0, ""
	}
	return count, owner
}

// permitRounds bounds how many transactions one acquire of a busy resource
// makes: each failed round means another acquire or release changed the
// resource's permits meanwhile, and the next round reads them again.
const permitRounds = 10

// acquire takes the lowest free permit of s's resource below s.limit (a
// lock: permit 0, the lock key itself, when no permit is held), or enters
// the permit its owner holds, or finds the permit a release handed to its
// waiter (etcd_queue.go). A permit is taken only by the first place in line,
// or with no one in line. A lock's first transaction takes permit 0 if the
// resource is free and no one waits, and else reads its permits and queue
// (and takes a place for a waiter); with a limit, or for a waiter that has
// a place, the first is that read alone. Each next one takes the chosen
// permit if its key is absent, the queue as read allows it and, unless the
// read was settled (etcdPermits.settled: then the limit key must be
// unchanged), no permit key changed since that read (a compare over the
// range of permit keys), and else reads them again. So never more than the
// limit are held: of two concurrent acquires that could exceed it together,
// one's transaction fails.
//
// A waiter keeps its place through a cluster that cannot answer for now
// (ErrEtcdUnavailable: a member killed, a leader change): the attempt counts
// as busy and the Acquire waits and tries again. Its token and lease stay
// the same from its first attempt on, so an attempt whose answer was lost
// is found out by the next: a place put again keeps its create revision, a
// permit taken is found holding its token (handedTo).
func (b *etcdBackend) acquire(ctx context.Context, s *Lease) (bool, error) {
	ok, err := b.attempt(ctx, s)
	if err != nil && s.wait != nil && errors.Is(err, ErrEtcdUnavailable) {
		return false, nil
	}
	return ok, err
}

func (b *etcdBackend) attempt(ctx context.Context, s *Lease) (bool, error) {
	ctx, cancel := callCtx(ctx, s.ttl)
	defer cancel()
	k := s.keys
	q, err := b.ownPlace(ctx, s)
	if err != nil {
		return false, err
	}
	var seen *etcdPermits // nil: the first round, which hopes for a free resource
	if s.limit > 1 || q != nil && q.lease != nil {
		// A resource of several permits is seldom free when it is contended,
		// and a waiter that tried before has its answer in etcd already
		// (its place, or a permit handed or taken): the first
		// round reads (a read-only transaction, which etcd answers without a
		// raft write), and the next takes a permit or a place.
		resp, err := b.txn(ctx).Then(permitReads(k, s.owner)...).Commit()
		if err != nil {
			return false, fmt.Errorf("etcd: %w", err)
		}
		seen = readPermits(s.locker, k, resp.Revision, resp.Responses)
	}
	leaseRetried := false
	for round := 0; round < permitRounds; round++ {
		if seen != nil {
			if kv, p := seen.handedTo(q); kv != nil {
				b.adopt(s, q, p, kv)
				return true, nil
			}
			if lockKV, ownersKV := seen.ownedBy(s.owner); lockKV != nil {
				return b.reenter(ctx, s, seen.permit[lockKV], lockKV, ownersKV)
			}
			if q != nil && q.key != "" && seen.place(q.key) == nil {
				q.key = "" // gone with its lease (its process was cut off for a TTL): in line again, at the end
			}
		}
		sh := (*etcdShared)(nil)
		if q != nil {
			sh = q.lease // a waiter's every key is on one lease, which its attempts keep alive
		}
		if sh == nil {
			if sh, err = b.leaseFor(ctx, s.ttl); err != nil {
				return false, err
			}
		}
		if q != nil {
			q.lease = sh
		}
		enqueue := q != nil && q.key == "" // a waiter without a place takes one when busy
		settled := false
		p, cmps := 0, []EtcdCmp{
			cmpCreate(k.lock, "=", 0),
			cmpCreate(k.permitPrefix(), "=", 0).WithPrefix(),
			cmpCreate(k.waiterPrefix(), "=", 0).WithPrefix(),
		}
		if seen != nil {
			mine := int64(math.MaxInt64)
			if q != nil && q.key != "" {
				mine = q.rev
			}
			ahead := seen.ahead(mine)
			settled = seen.settled(s.limit)
			free := false
			if ahead == nil {
				p, free = seen.free(s.limit, round > 0 && settled)
			}
			if !free && !enqueue {
				if q != nil {
					q.ahead = ""
					if ahead != nil {
						q.ahead = string(ahead.Key)
					}
				}
				seen.busy(s)
				return false, nil
			}
			if !free {
				// Busy, or someone waits ahead: a place at the end of the line,
				// and a look at the line it joined.
				resp, err := b.txn(ctx).Then(append([]EtcdOp{opPlace(s, sh)}, permitReads(k, s.owner)...)...).Commit()
				if errors.Is(err, ErrEtcdLeaseNotFound) && !leaseRetried {
					leaseRetried = true
					b.forget(sh) // expired or revoked meanwhile: grant a new one, once
					q.lease = nil
					continue
				}
				if err != nil {
					return false, fmt.Errorf("etcd: %w", err)
				}
				seen = readPermits(s.locker, k, resp.Revision, resp.Responses[1:])
				q.placed(s, seen)
				continue
			}
			cmps = append([]EtcdCmp{cmpCreate(k.permitKeys(p).lock, "=", 0)}, takeCmps(s, q)...)
			if settled {
				// The key space bounds the holders: no permit at or above the
				// limit is held, and none can be taken while the limit key
				// stays as read (a larger limit would rewrite it first).
				cmps = append(cmps, cmpMod(k.limitKey(), "=", seen.limit.ModRevision))
			} else {
				cmps = append(cmps,
					cmpMod(k.lock, "<", seen.rev+1),
					cmpMod(k.permitPrefix(), "<", seen.rev+1).WithPrefix())
			}
		}
		pk := k.permitKeys(p)
		put := []EtcdOp{opPut(pk.lock, s.token, sh.id)}
		if s.owner != "" {
			put = append(put, opPut(pk.owners, ownersValue(1, s.owner), sh.id))
		}
		if s.limit > 1 {
			if !settled {
				put = append(put, opPut(k.limitKey(), strconv.Itoa(s.limit), sh.id))
			}
		} else {
			put = append(put, opDelete(k.limitKey())) // a lock of a free resource: no limit left over
		}
		if q != nil && q.key != "" {
			put = append(put, opDelete(q.key)) // out of line: it holds
		}
		orElse := permitReads(k, s.owner)
		if enqueue {
			orElse = append([]EtcdOp{opPlace(s, sh)}, orElse...)
		}
		resp, err := b.txn(ctx).If(cmps...).Then(put...).Else(orElse...).Commit()
		if errors.Is(err, ErrEtcdLeaseNotFound) && !leaseRetried {
			leaseRetried = true
			b.forget(sh) // expired or revoked meanwhile: grant a new one, once
			if q != nil {
				q.key, q.lease = "", nil // the place went with it
			}
			round--
			continue
		}
		if err != nil {
			return false, fmt.Errorf("etcd: %w", err)
		}
		if resp.Succeeded {
			s.keys = pk
			s.fence = resp.Revision
			s.ext = &etcdLease{shared: sh, id: sh.id, contended: seen != nil && len(seen.queue) > 0}
			if alive := sh.aliveAt(); alive.Before(s.sent) {
				s.sent = alive // the key lives as long as the lease: from its last keep-alive
			}
			if q != nil {
				q.key = ""
			}
			b.hold(s)
			return true, nil
		}
		reads := resp.Responses
		if enqueue {
			reads = reads[1:]
		}
		seen = readPermits(s.locker, k, resp.Revision, reads)
		if enqueue {
			q.placed(s, seen)
		}
	}
	seen.busy(s)
	return false, nil // the permits kept changing: busy for now, as a held resource is
}

// busy tells a waiting Acquire of s the revision its busy attempt read, from
// which waitChange watches.
func (p *etcdPermits) busy(s *Lease) {
	if s.wait != nil && p != nil {
		s.wait.rev = p.rev
	}
}

// permitReads read the resource of k's permits and queue for readPermits:
// its lock key, the range of permit keys, the limit key, the places in line
// and, for an owner, the range of owners keys.
func permitReads(k keys, owner string) []EtcdOp {
	read := []EtcdOp{opGet(k.lock), opGetPrefix(k.permitPrefix()), opGet(k.limitKey()), opGetPrefix(k.waiterPrefix())}
	if owner != "" {
		read = append(read, opGetPrefix(k.ownersPrefix()))
	}
	return read
}

// etcdPermits is what one read found of a resource's permits: their lock
// keys (permit k by key), the places in line, and their owners keys (by
// key) when asked.
type etcdPermits struct {
	rev    int64 // the read's revision: no permit key changed after it, when it was made
	permit map[*EtcdKV]int
	held   map[int]bool
	owners map[string]*EtcdKV
	limit  *EtcdKV   // the limit key, or nil
	queue  []*EtcdKV // the places in line, first first (etcd_queue.go)
	keys   keys      // the resource's
}

// settled reports whether a take of a permit below limit needs to compare
// only its own key and the limit key: the limit key says limit, and no
// permit at or above it is held. Then the limit key names every permit that
// may be taken while it is unchanged, and those are at most limit keys.
// Otherwise (another limit, a lowered one's holders still at work, no limit
// key) the take compares the whole range of permits to its read, and writes
// the limit key.
func (p *etcdPermits) settled(limit int) bool {
	if p == nil || p.limit == nil || string(p.limit.Value) != strconv.Itoa(limit) {
		return false
	}
	for k := range p.held {
		if k >= limit {
			return false
		}
	}
	return true
}

// readPermits reads the answers of permitReads on the resource of k, made
// at revision rev.
func readPermits(l *Locker, k keys, rev int64, reads []*EtcdRange) *etcdPermits {
	p := &etcdPermits{rev: rev, permit: map[*EtcdKV]int{}, held: map[int]bool{},
		owners: map[string]*EtcdKV{}, keys: k}
	for i, rr := range reads {
		if rr == nil {
			continue
		}
		switch i {
		case 2:
			p.limit = firstKV(rr)
			continue
		case 3:
			p.queueRead(rr.Kvs)
			continue
		case 4:
			for _, kv := range rr.Kvs {
				p.owners[string(kv.Key)] = kv
			}
			continue
		}
		for _, kv := range rr.Kvs {
			if _, n, ok := l.permitOf(string(kv.Key)); ok {
				p.permit[kv], p.held[n] = n, true
			}
		}
	}
	return p
}

// free returns the lowest free permit below limit (with spread, a random
// free one), and false when limit or more are held (a lowered limit: more
// may be).
func (p *etcdPermits) free(limit int, spread bool) (int, bool) {
	if len(p.held) >= limit {
		return 0, false
	}
	var free []int
	for k := range limit {
		if !p.held[k] {
			if !spread {
				return k, true
			}
			free = append(free, k)
		}
	}
	if len(free) == 0 {
		return 0, false
	}
	// A take that lost a race for a permit tries a free one at random, so
	// that the acquirers who read the same permits part ways.
	return free[rand.IntN(len(free))], true
}

// ownedBy returns the lock key of the permit that owner holds, with its
// owners key, or nils.
func (p *etcdPermits) ownedBy(owner string) (lockKV, ownersKV *EtcdKV) {
	if owner == "" {
		return nil, nil
	}
	for kv, k := range p.permit {
		o := p.owners[p.keys.permitKeys(k).owners]
		if o == nil || o.Lease != kv.Lease {
			continue // a plain hold, or someone else's
		}
		if n, who := parseOwners(o.Value); who == owner && n >= 1 {
			return kv, o
		}
	}
	return nil, nil
}

// reenter joins the hold of s.owner on permit p of s's resource, whose lock
// and owners keys were read as lockKV and ownersKV: one more hold count, by
// compare-and-swap on the owners key.
func (b *etcdBackend) reenter(ctx context.Context, s *Lease, p int, lockKV, ownersKV *EtcdKV) (bool, error) {
	pk := s.keys.permitKeys(p)
	for range 10 { // each round lost a race with another hold of the same owner
		if lockKV == nil {
			return false, nil // released meanwhile: the caller's next attempt may take it afresh
		}
		if ownersKV == nil || ownersKV.Lease != lockKV.Lease {
			return false, nil // a plain hold, or someone else's
		}
		n, owner := parseOwners(ownersKV.Value)
		if owner != s.owner || n < 1 {
			return false, nil
		}
		id := lockKV.Lease
		next, err := b.txn(ctx).
			If(cmpMod(pk.owners, "=", ownersKV.ModRevision),
				cmpMod(pk.lock, "=", lockKV.ModRevision)).
			Then(opPut(pk.owners, ownersValue(n+1, owner), id)).
			Else(opGet(pk.lock), opGet(pk.owners)).
			Commit()
		if err != nil {
			return false, fmt.Errorf("etcd: re-enter: %w", err)
		}
		if next.Succeeded {
			s.keys = pk
			s.token, s.fence, s.reentry = string(lockKV.Value), lockKV.ModRevision, true
			s.ext = &etcdLease{id: id}
			b.hold(s)
			return true, nil
		}
		lockKV, ownersKV = firstKV(next.Responses[0]), firstKV(next.Responses[1])
	}
	return false, errors.New("etcd: re-enter: too many concurrent changes of the hold count")
}

func firstKV(rr *EtcdRange) *EtcdKV {
	if rr != nil && len(rr.Kvs) > 0 {
		return rr.Kvs[0]
	}
	return nil
}

// checkBatch is how many key reads one renewal transaction carries: etcd
// refuses transactions of more than 128 operations by default (--max-txn-ops).
const checkBatch = 128

// renew keeps every distinct etcd lease of leases alive (one keep-alive per
// lease, all at once) and reads every lock key (checkBatch per transaction,
// all at once). A lease is renewed when its etcd lease was kept alive and its
// key still holds its token; lost (expired) when the etcd lease or the key is
// gone, lost (stolen) when the key holds another token or another lease.
//
// A member that does not answer (paused, cut off) leaves its calls hanging
// rather than failing them, so each round gets a quarter of the time left
// before ctx's deadline (the round's earliest local deadline): the watchdog
// retries in time. Within a round each call is hedged (see hedged): a copy
// that a hanging member holds is overtaken by one that the client's
// round-robin balancer sends to the next member, so the keep-alives reach
// the new leader in the round that finds the old one paused.
func (b *etcdBackend) renew(ctx context.Context, leases []*Lease, results []error) {
	timeout := time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d) / 4
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	copies, delay := len(b.cl.Endpoints()), timeout/4
	sent := time.Now()
	ids := map[int64]error{} // keep-alive result per etcd lease
	var distinct []int64
	for _, s := range leases {
		if id := s.ext.(*etcdLease).id; !slices.Contains(distinct, id) {
			distinct = append(distinct, id)
		}
	}
	kvs := make([]*EtcdKV, len(leases))
	checkErrs := make([]error, len(leases))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range distinct {
		wg.Go(func() {
			_, err := hedged(ctx, copies, delay, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, b.cl.KeepAliveOnce(ctx, id)
			})
			mu.Lock()
			ids[id] = err
			mu.Unlock()
		})
	}
	for from := 0; from < len(leases); from += checkBatch {
		to := min(from+checkBatch, len(leases))
		wg.Go(func() {
			ops := make([]EtcdOp, 0, to-from)
			for _, s := range leases[from:to] {
				ops = append(ops, opGet(s.keys.lock))
			}
			resp, err := hedged(ctx, copies, delay, func(ctx context.Context) (*EtcdTxnResponse, error) {
				return b.txn(ctx).Then(ops...).Commit()
			})
			for k := from; k < to; k++ {
				if err != nil {
					checkErrs[k] = err
				} else {
					kvs[k] = firstKV(resp.Responses[k-from])
				}
			}
		})
	}
	wg.Wait()
	for _, s := range leases {
		if e := s.ext.(*etcdLease); ids[e.id] == nil && e.shared != nil {
			e.shared.renewedAt(sent)
		}
	}
	for i, s := range leases {
		e := s.ext.(*etcdLease)
		kaErr := ids[e.id]
		switch {
		case errors.Is(kaErr, ErrEtcdLeaseNotFound):
			results[i] = s.lost(ReasonExpired)
		case kaErr != nil:
			results[i] = fmt.Errorf("lock: renew %q: etcd: keep-alive: %w", s.resource, kaErr)
		case checkErrs[i] != nil:
			results[i] = fmt.Errorf("lock: renew %q: etcd: %w", s.resource, checkErrs[i])
		default:
			results[i] = keyStatus(s, kvs[i])
		}
	}
}

// hedged runs call, an idempotent one (a keep-alive, a read), and starts
// another copy every delay while none has answered, up to n copies (one per
// member): each copy is a new pick of the client's round-robin balancer, so
// a member that hangs holds one copy, not the answer. It returns the first
// success or lease-not-found answer; else, once every copy failed, the last
// error. Copies still running are cancelled on return.
func hedged[T any](ctx context.Context, n int, delay time.Duration, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		v   T
		err error
	}
	answers := make(chan answer, max(n, 1))
	started, pending := 0, 0
	start := func() {
		started++
		pending++
		go func() {
			v, err := call(ctx)
			answers <- answer{v, err}
		}()
	}
	start()
	next := time.NewTimer(delay)
	defer next.Stop()
	for {
		select {
		case a := <-answers:
			pending--
			if a.err == nil || errors.Is(a.err, ErrEtcdLeaseNotFound) || pending == 0 && (started >= n || ctx.Err() != nil) {
				return a.v, a.err
			}
			if pending == 0 { // every copy failed quickly: try the next member now
				start()
				next.Reset(delay)
			}
		case <-next.C:
			if started < n {
				start()
				next.Reset(delay)
			}
		}
	}
}

// keyStatus tells what kv (the lock key as read, or nil) says of s.
func keyStatus(s *Lease, kv *EtcdKV) error {
	switch {
	case kv == nil:
		return s.lost(ReasonExpired)
	case string(kv.Value) != s.token || kv.ModRevision != s.fence ||
		kv.Lease != s.ext.(*etcdLease).id:
		return s.lost(ReasonStolen)
	}
	return nil
}

// release deletes the lock key (and the owners key) if it holds our token
// and was created by our acquire, or gives one reentrant hold back. The
// shared etcd lease is not revoked: other locks may be on it, and unused it
// expires by itself.
func (b *etcdBackend) release(ctx context.Context, s *Lease) error {
	ctx, cancel := callCtx(ctx, s.ttl)
	defer cancel()
	b.unhold(s) // our own delete is not a loss
	err := b.releaseOnce(ctx, s)
	for delay := time.Duration(0); errors.Is(err, ErrEtcdUnavailable) && ctx.Err() == nil; {
		// etcd could not answer (a leader change, a member gone), and the
		// delete or hand-off may have committed: the key says whether.
		delay = backoff.RedisRetry.Next(delay)
		backoff.Sleep(ctx, delay)
		var kv *EtcdRange
		if kv, err = b.get(ctx, opGet(s.keys.lock)); err != nil {
			continue
		}
		switch now := firstKV(kv); {
		case now == nil:
			return nil // deleted: by this release, or with its lease
		case string(now.Value) == s.token && now.ModRevision == s.fence:
			err = b.releaseOnce(ctx, s) // still ours: again
		case string(now.Value) == s.ext.(*etcdLease).handedTo:
			return nil // handed on by this release
		default:
			err = keyStatus(s, now)
		}
	}
	if err != nil && !errors.Is(err, ErrLockLost) {
		b.hold(s) // still ours, as far as we know: keep watching
		return fmt.Errorf("lock: release %q: etcd: %w", s.resource, err)
	}
	return err
}

// releaseRounds bounds the transactions of one release.
const releaseRounds = 10

func (b *etcdBackend) releaseOnce(ctx context.Context, s *Lease) error {
	ours := cmpMod(s.keys.lock, "=", s.fence)
	mine := cmpValue(s.keys.lock, s.token)
	del := []EtcdOp{opDelete(s.keys.lock)}
	if s.owner != "" {
		del = append(del, opDelete(s.keys.owners))
	}
	// What is left of the resource once deleted (a read in a transaction
	// sees its writes): for dropLimit.
	base := s.keys.permitKeys(0)
	del = append(del, opCount(base.lock), opCountPrefix(base.permitPrefix()), opCount(base.limitKey()))
	e := s.ext.(*etcdLease)
	for round := range releaseRounds { // each round lost a race with another hold of the same owner, or a hand-off
		var cmps []EtcdCmp
		var owners *EtcdKV
		if s.owner != "" {
			// One hold of several: give it back; the last one deletes.
			resp, err := b.txn(ctx).If(ours, mine).Then(opGet(s.keys.owners)).Else(opGet(s.keys.lock)).Commit()
			if err != nil {
				return err
			}
			if !resp.Succeeded {
				return keyStatus(s, firstKV(resp.Responses[0]))
			}
			owners = firstKV(resp.Responses[0])
			if owners != nil {
				cmps = append(cmps, cmpMod(s.keys.owners, "=", owners.ModRevision))
				if n, owner := parseOwners(owners.Value); owner == s.owner && n > 1 {
					r, err := b.txn(ctx).If(append(cmps, ours, mine)...).
						Then(opPut(s.keys.owners, ownersValue(n-1, owner), owners.Lease)).
						Commit()
					if err != nil {
						return err
					}
					if r.Succeeded {
						return nil
					}
					continue
				}
			}
		}
		last := round == releaseRounds-1 // lets go without a hand-off: the first place takes the permit
		if e.contended && !last {
			handed, again, err := b.handOn(ctx, s, append(cmps, ours, mine))
			switch {
			case err != nil:
				return err
			case handed:
				return nil
			case again:
				continue
			}
		}
		plain := append(cmps, ours, mine)
		if !e.contended && !last {
			plain = append(plain, cmpCreate(base.waiterPrefix(), "=", 0).WithPrefix()) // no one to hand it to
		}
		resp, err := b.txn(ctx).If(plain...).Then(del...).Else(opGet(s.keys.lock)).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			b.dropLimit(ctx, s, resp.Responses[len(del)-3:])
			return nil
		}
		kv := firstKV(resp.Responses[0])
		if kv == nil || string(kv.Value) != s.token || kv.ModRevision != s.fence {
			return keyStatus(s, kv)
		}
		if !e.contended {
			e.contended = true // someone waits: hand it on
			continue
		}
		if s.owner == "" {
			return keyStatus(s, kv)
		}
	}
	return errors.New("too many concurrent changes of the hold count")
}

// handOn hands s's permit to the first place in its resource's line, when
// there is one that may take it (nextWaiter), in a transaction that also
// compares cmps (s still holds it). It reports whether it did; again when
// it could have but the first place changed meanwhile (read again).
//
// The releases of one resource in this process hand on one at a time: two
// that read the same first place would both try it, and the loser's
// transaction costs a raft proposal too.
func (b *etcdBackend) handOn(ctx context.Context, s *Lease, cmps []EtcdCmp) (handed, again bool, err error) {
	defer b.handing(s.keys.base)()
	next, err := b.nextWaiter(ctx, s)
	if err != nil || next == nil {
		return false, false, err
	}
	s.ext.(*etcdLease).handedTo = next.v.Token
	resp, err := b.txn(ctx).If(append(cmps, cmpCreate(string(next.place.Key), "=", next.place.CreateRevision))...).
		Then(next.ops(s.keys)...).Else(opGet(s.keys.lock)).Commit()
	if err != nil {
		return false, false, err
	}
	if resp.Succeeded {
		return true, false, nil
	}
	if kv := firstKV(resp.Responses[0]); kv == nil || string(kv.Value) != s.token || kv.ModRevision != s.fence {
		return false, false, keyStatus(s, kv)
	}
	return false, true, nil
}

// handing serializes this process's hand-offs of the resource of lock key
// base; the returned func ends this one's turn.
func (b *etcdBackend) handing(base string) func() {
	b.mu.Lock()
	h := b.handoffs[base]
	if h == nil {
		h = &etcdHanding{}
		b.handoffs[base] = h
	}
	h.users++
	b.mu.Unlock()
	h.mu.Lock()
	return func() {
		h.mu.Unlock()
		b.mu.Lock()
		if h.users--; h.users == 0 {
			delete(b.handoffs, base)
		}
		b.mu.Unlock()
	}
}

// etcdHanding is the turn of one resource's hand-offs in this process.
type etcdHanding struct {
	mu    sync.Mutex
	users int // holding or waiting for mu (b.mu guards it)
}

// dropLimit deletes the limit key of s's resource when the release left no
// permit held (left: the counts of the lock key, the permit keys and the
// limit key after it), unless a permit was taken meanwhile: the limit lives
// no longer than its permits. It is bound to a holder's shared lease, which
// may outlive the hold. A failure leaves it to that lease's expiry.
func (b *etcdBackend) dropLimit(ctx context.Context, s *Lease, left []*EtcdRange) {
	lock, permits, limit := left[0], left[1], left[2]
	if lock == nil || permits == nil || limit == nil || lock.Count+permits.Count > 0 || limit.Count == 0 {
		return // a permit is held, or there is no limit
	}
	k := s.keys.permitKeys(0)
	_, _ = b.txn(ctx).
		If(cmpCreate(k.lock, "=", 0),
			cmpCreate(k.permitPrefix(), "=", 0).WithPrefix()).
		Then(opDelete(k.limitKey())).
		Commit()
}

// hold registers s for the watch, starting the watch with the first lock.
func (b *etcdBackend) hold(s *Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.held[s.keys.lock] = append(b.held[s.keys.lock], s)
	if !b.watchOn {
		b.watchOn = true
		ctx, cancel := context.WithCancel(context.Background())
		b.stop, b.stopped = cancel, make(chan struct{})
		go b.watch(ctx, s.fence+1)
	}
}

func (b *etcdBackend) unhold(s *Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.held[s.keys.lock]
	for i, x := range list {
		if x == s {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(b.held, s.keys.lock)
	} else {
		b.held[s.keys.lock] = list
	}
}

func (b *etcdBackend) notifyLoss(f func(*Lease, error)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.notify = append(b.notify, f)
}

// watchCheck is how often the watch asks its member for a progress notice.
// A check that finds nothing heard since the last one (no events, no
// notice) means the member hangs, a paused process or a cut-off link, which
// fails no call: the watch starts again on a new stream, which the client's
// balancer gives to the next member.
const watchCheck = 100 * time.Millisecond

// watch follows every change under the lock prefix from revision rev on and
// turns a change to a held lock's key into a loss, at once. When the watch
// ends (compaction, a cancelled stream, a member that hangs) it starts again
// from where it was, or from now when that history is gone; renewal covers
// what it missed.
func (b *etcdBackend) watch(ctx context.Context, rev int64) {
	defer close(b.stopped)
	var delay time.Duration
	for stream := 0; ctx.Err() == nil; stream++ {
		// The client shares one gRPC stream among the watches of equal
		// metadata: a new value is a new stream, and a new pick of member.
		sctx, cancel := context.WithCancel(ctx)
		var heard atomic.Bool
		checked, stalled := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(checked)
			if b.checkWatch(sctx, &heard) {
				close(stalled)
				cancel() // Watch itself waits for the member to confirm the watch
			}
		}()
		wch := b.cl.Watch(sctx, b.watchPrefix, rev, strconv.Itoa(stream))
	read:
		for {
			select {
			case <-stalled:
				delay = 0 // a hung member, not a lost cluster: the next stream goes to another at once
				break read
			case resp, ok := <-wch:
				if !ok {
					break read
				}
				heard.Store(true)
				delay = 0 // the watch worked: after it ends, restart it soon
				if resp.CompactRevision > 0 {
					rev = resp.CompactRevision
				}
				if resp.Err != nil {
					break read
				}
				for _, ev := range resp.Events {
					b.changed(ev)
				}
				rev = max(rev, resp.Revision+1)
			}
		}
		cancel()
		<-checked
		// The client ends a stream stuck on a hanging member in its own time
		// (at the latest when its keep-alive ping goes unanswered); the next
		// stream does not wait for that.
		go func() {
			for range wch {
			}
		}()
		delay = backoff.Reconnect.Next(delay) // a lost leader or cluster: do not spin (from Min after a stall)
		backoff.Sleep(ctx, delay)
	}
}

// checkWatch asks for a progress notice on the watch stream of ctx every
// watchCheck, and reports true when nothing was heard on it since the last
// ask; false when ctx ends.
func (b *etcdBackend) checkWatch(ctx context.Context, heard *atomic.Bool) bool {
	t := time.NewTicker(watchCheck)
	defer t.Stop()
	for asked := false; ; asked = true { // the first tick lets the stream start
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if asked && !heard.Load() {
			return true
		}
		heard.Store(false)
		// Its stream may be stuck on the member too: the ask is bounded.
		rctx, rcancel := context.WithTimeout(ctx, watchCheck)
		_ = b.cl.RequestProgress(rctx) // no answer is what the next tick looks for
		rcancel()
	}
}

// changed applies one event to the leases held on its key.
func (b *etcdBackend) changed(ev EtcdEvent) {
	key := string(ev.Kv.Key)
	b.mu.Lock()
	var lost []*Lease
	var reasons []Reason
	list := b.held[key]
	keep := list[:0]
	for _, s := range list {
		switch {
		case ev.Kv.ModRevision <= s.fence: // before our acquire
		case ev.Delete:
			lost, reasons = append(lost, s), append(reasons, ReasonExpired)
			continue
		default: // written after our acquire or hand-off: another holder's
			lost, reasons = append(lost, s), append(reasons, ReasonStolen)
			continue
		}
		keep = append(keep, s)
	}
	if len(list) > 0 {
		if len(keep) == 0 {
			delete(b.held, key)
		} else {
			b.held[key] = keep
		}
	}
	notify := b.notify
	b.mu.Unlock()
	for i, s := range lost {
		err := s.state.set(s.lost(reasons[i]))
		if !errors.Is(err, ErrLockLost) {
			continue // released meanwhile
		}
		for _, f := range notify {
			f(s, err)
		}
	}
}

// close stops the watch; leases stay with their holders.
func (b *etcdBackend) close() error {
	b.mu.Lock()
	if !b.closed {
		close(b.done)
	}
	b.closed = true
	stop, stopped := b.stop, b.stopped
	b.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	return nil
}

// ping reads one key, linearizably: it needs the cluster's quorum.
func (b *etcdBackend) ping(ctx context.Context) error {
	_, err := b.get(ctx, opCount(b.watchPrefix+"ready"))
	return err
}
