package lock

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/backoff"
)

// The waiter queue on etcd, one per resource across every process, as
// etcd's concurrency.Mutex keeps it: a waiting Acquire holds a place, the key
// P{R}:queue:<waiter id> bound to its process's etcd lease, and its place in
// line is the key's create revision, which etcd's one revision counter gives
// in the order the places were committed. The permits are held by the
// earliest arrivals:
//
//   - An attempt that finds the resource busy, or anyone waiting ahead of it,
//     takes a place at the end of the line in the same transaction (a lock's
//     first attempt), or in one of its own after a read (a limit's): one raft
//     proposal. TryAcquire takes no place and is busy while anyone waits.
//   - A release whose acquire found others in line (or was handed the
//     permit) reads the queue (a read, no proposal); any other deletes the
//     key if no one waits, and reads the queue only when someone does. When
//     the first place may take the permit (below its limit, no more than its
//     limit held, its limit the resource's), the release hands it over in
//     the same transaction that releases it: the permit key is rewritten with the first waiter's
//     token on that waiter's lease, and its place deleted, if that place is
//     still there. One proposal, so a contended acquisition costs two
//     (place and hand-off). The rewrite is the fence: a permit's fence is the
//     revision that last wrote its key (its create, or a hand-off), which
//     strictly increases per permit like every revision.
//   - Each waiter watches only the key just ahead of it, from the revision
//     of its last busy read: the place before it, or for the first place,
//     the resource's permits (a release that could not hand over, a holder's
//     lease that expired) and its own place (a hand-off deletes it). A change
//     there makes it read again (no proposal): it finds the permit handed to
//     it, or the next place ahead, or, first and a permit free, takes one in
//     a transaction that requires its place to be the lowest.
//   - A waiter that gives up deletes its place (and releases, handing on, a
//     permit handed to it meanwhile); one whose process dies or is cut off
//     leaves with its etcd lease, within its TTL: its attempts keep that
//     lease alive (every ttl/3 at the latest, however long it waits), and a
//     hand-off to a dead waiter's place frees with its lease too. Either way
//     the next place moves up.
//
// What etcd guarantees, which the order rests on: revisions are assigned by
// the raft log's order and a committed transaction is on a quorum, so a
// killed or paused member, the leader included, changes no place's revision
// and loses none; reads and transactions are linearizable; a watch from a
// revision sees every later event of its keys in revision order; a new
// leader extends every lease by its TTL, so a failover expires no place.

// etcdPlace is a waiting Acquire's place in its resource's queue.
type etcdPlace struct {
	key   string      // P{R}:queue:<waiter id>; "" while it has none
	rev   int64       // the key's create revision: its place in line
	token string      // the waiter's token for every attempt: what a hand-off writes
	lease *etcdShared // the lease the key is bound to, kept alive by the waiter's attempts
	ahead string      // the place just ahead, which the waiter watches; "" for the first
	of    *Lease      // the waiter's latest attempt: its resource, ttl and owner
}

// placeValue is a place's value: what a release needs to hand the waiter a
// permit (its token and owner) and to know that it may (its limit).
type placeValue struct {
	Token string `json:"token"`
	Owner string `json:"owner,omitempty"`
	Limit int    `json:"limit"`
}

func parsePlace(kv *EtcdKV) (placeValue, bool) {
	var v placeValue
	err := json.Unmarshal(kv.Value, &v)
	return v, err == nil && v.Token != "" && v.Limit >= 1
}

// opPlace puts s's place in line on lease sh.
func opPlace(s *Lease, sh *etcdShared) EtcdOp {
	v, _ := json.Marshal(placeValue{Token: s.token, Owner: s.owner, Limit: s.limit})
	return opPut(s.keys.waiterKey(s.wait.id), string(v), sh.id)
}

// placed records the place of s's waiter as seen read right after its put:
// a put again (the first one's answer lost) keeps the first's revision.
func (q *etcdPlace) placed(s *Lease, seen *etcdPermits) {
	q.key = s.keys.waiterKey(s.wait.id)
	if kv := seen.place(q.key); kv != nil {
		q.rev = kv.CreateRevision
	}
}

// place returns the place key as read, or nil.
func (p *etcdPermits) place(key string) *EtcdKV {
	for _, kv := range p.queue {
		if string(kv.Key) == key {
			return kv
		}
	}
	return nil
}

// ahead returns the last place before revision rev, or nil.
func (p *etcdPermits) ahead(rev int64) *EtcdKV {
	var last *EtcdKV
	for _, kv := range p.queue {
		if kv.CreateRevision >= rev {
			break
		}
		last = kv
	}
	return last
}

// handedTo returns the permit key that a release handed to q's waiter, with
// its permit, or nil.
func (p *etcdPermits) handedTo(q *etcdPlace) (*EtcdKV, int) {
	if q == nil || q.lease == nil {
		return nil, 0
	}
	for kv, k := range p.permit {
		if kv.Lease == q.lease.id && string(kv.Value) == q.token {
			return kv, k
		}
	}
	return nil, 0
}

// queueRead sorts the places read into their order (create revision).
func (p *etcdPermits) queueRead(kvs []*EtcdKV) {
	p.queue = slices.SortedFunc(slices.Values(kvs), func(a, b *EtcdKV) int {
		return cmp.Compare(a.CreateRevision, b.CreateRevision)
	})
}

// takeCmps are what a take compares besides the permits: that no place is
// ahead of s's (its own place is the lowest), or that there is none.
func takeCmps(s *Lease, q *etcdPlace) []EtcdCmp {
	if q != nil && q.key != "" {
		return []EtcdCmp{cmpCreate(q.key, "=", q.rev), cmpCreate(s.keys.waiterPrefix(), ">", q.rev-1).WithPrefix()}
	}
	return []EtcdCmp{cmpCreate(s.keys.waiterPrefix(), "=", 0).WithPrefix()}
}

// ownPlace reports the place of s's waiter (nil for TryAcquire), keeping
// its lease alive when its last keep-alive is ttl/3 old: a waiter keeps its
// place for as long as it waits. A lease found gone took the place with it:
// the waiter takes a new one at the end of the line.
func (b *etcdBackend) ownPlace(ctx context.Context, s *Lease) (*etcdPlace, error) {
	if s.wait == nil {
		return nil, nil
	}
	q := &s.wait.place
	q.of = s
	if q.token == "" {
		q.token = s.token // the waiter's token from its first attempt on
	}
	s.token = q.token
	if q.lease == nil || time.Since(q.lease.aliveAt()) < s.ttl/3 {
		return q, nil
	}
	sent := time.Now()
	switch err := b.cl.KeepAliveOnce(ctx, q.lease.id); {
	case errors.Is(err, ErrEtcdLeaseNotFound):
		b.forget(q.lease)
		q.key, q.lease = "", nil // the place went with it
	case err != nil:
		return nil, fmt.Errorf("etcd: keep place: %w", err)
	default:
		q.lease.renewedAt(sent)
	}
	return q, nil
}

// adopt makes s the holder of permit p, which a release handed to its
// waiter q (kv: the permit key as read).
func (b *etcdBackend) adopt(s *Lease, q *etcdPlace, p int, kv *EtcdKV) {
	s.keys = s.keys.permitKeys(p)
	s.token, s.fence = q.token, kv.ModRevision
	s.ext = &etcdLease{shared: q.lease, id: kv.Lease, contended: true}
	if alive := q.lease.aliveAt(); alive.Before(s.sent) {
		s.sent = alive // the key lives as long as the lease: from its last keep-alive
	}
	q.key = ""
	b.hold(s)
}

// waitChange blocks until the key w watches changes after w's last busy
// read (the place just ahead; for the first place the resource's permits,
// its limit and the place itself), d passes or ctx ends. Each wait is at
// most a third of the TTL, so that the waiter's next attempt keeps its
// place's lease alive.
func (b *etcdBackend) waitChange(ctx context.Context, k keys, w *waitState, d time.Duration) {
	q := &w.place
	if q.key == "" || q.of == nil {
		backoff.Sleep(ctx, d)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, min(d, max(q.of.ttl/3, time.Millisecond)))
	defer cancel()
	watch := q.ahead
	if watch == "" {
		watch = k.base // every key of the resource: the events below sort them
	}
	for resp := range b.cl.Watch(wctx, watch, w.rev+1, "queue") {
		if resp.Err != nil || resp.CompactRevision > 0 {
			return // read again
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			if q.ahead != "" || key == q.key || key == k.lock || key == k.limitKey() || strings.HasPrefix(key, k.permitPrefix()) {
				return
			}
		}
	}
}

// stopWaiting takes w's place out of the line when its Acquire ends
// without the lock. When etcd cannot be reached it tries again in the
// background until it can (the process's other holds may keep the place's
// lease alive), or the Locker is closed.
func (b *etcdBackend) stopWaiting(_ keys, w *waitState) {
	q := w.place
	w.place.key = ""
	if q.key == "" {
		return
	}
	if b.leave(q) == nil {
		return
	}
	go func() {
		var delay time.Duration
		for {
			delay = backoff.Reconnect.Next(delay)
			select {
			case <-b.done:
				return
			case <-time.After(delay):
			}
			if b.leave(q) == nil {
				return
			}
		}
	}()
}

// leave deletes place q; if a release handed its waiter a permit
// meanwhile, it releases that permit, which hands it on.
func (b *etcdBackend) leave(q etcdPlace) error {
	s := q.of
	ctx, cancel := callCtx(context.Background(), s.ttl)
	defer cancel()
	k := s.locker.keysFor(s.resource)
	resp, err := b.txn(ctx).If(cmpCreate(q.key, "=", q.rev)).Then(opDelete(q.key)).Else(permitReads(k, "")...).Commit()
	if err != nil || resp.Succeeded {
		return err
	}
	kv, p := readPermits(s.locker, k, resp.Revision, resp.Responses).handedTo(&q)
	if kv == nil {
		return nil // gone with its lease
	}
	handed := &Lease{locker: s.locker, keys: k.permitKeys(p), resource: s.resource, token: q.token,
		fence: kv.ModRevision, ttl: s.ttl, owner: s.owner, ext: &etcdLease{id: kv.Lease, contended: true}}
	if err := b.releaseOnce(ctx, handed); err != nil && !errors.Is(err, ErrLockLost) {
		return err
	}
	return nil
}

// etcdHandOff is the first place of a resource's queue, to which a release
// of permit k may hand that permit.
type etcdHandOff struct {
	place     *EtcdKV
	v         placeValue
	dropLimit bool // a lock handed on: no limit left over (as a lock's acquire)
}

// nextWaiter reads the queue of s's resource and returns the first place
// if s's release may hand it s's permit: below that waiter's limit, no more
// than its limit held, and its limit the resource's (so that no take's
// compare of the limit key is fooled); nil otherwise, and then the first
// place, which watches the permits, takes one itself.
func (b *etcdBackend) nextWaiter(ctx context.Context, s *Lease) (*etcdHandOff, error) {
	base := s.keys.permitKeys(0)
	resp, err := b.txn(ctx).Then(permitReads(base, "")...).Commit()
	if err != nil {
		return nil, err
	}
	seen := readPermits(s.locker, base, resp.Revision, resp.Responses)
	if len(seen.queue) == 0 {
		return nil, nil
	}
	first := seen.queue[0]
	v, ok := parsePlace(first)
	if !ok || s.keys.permit >= v.Limit || len(seen.held) > v.Limit {
		return nil, nil
	}
	declared := ""
	if seen.limit != nil {
		declared = string(seen.limit.Value)
	}
	if v.Limit > 1 && declared != fmt.Sprint(v.Limit) {
		return nil, nil
	}
	return &etcdHandOff{place: first, v: v, dropLimit: v.Limit == 1 && seen.limit != nil}, nil
}

// ops are what hands permit key pk over: the permit rewritten with the
// waiter's token on its lease (and its owners key), its place deleted.
func (h *etcdHandOff) ops(pk keys) []EtcdOp {
	ops := []EtcdOp{opPut(pk.lock, h.v.Token, h.place.Lease), opDelete(string(h.place.Key))}
	if h.v.Owner != "" {
		ops = append(ops, opPut(pk.owners, ownersValue(1, h.v.Owner), h.place.Lease))
	} else {
		ops = append(ops, opDelete(pk.owners))
	}
	if h.dropLimit {
		ops = append(ops, opDelete(pk.limitKey()))
	}
	return ops
}

// waiters returns resource's places in line, first first. Since is the
// waiter's own clock at its first attempt (its token's), not the server's.
func (b *etcdBackend) waiters(ctx context.Context, l *Locker, resource string) ([]Waiter, error) {
	resp, err := b.get(ctx, opGetPrefix(l.keysFor(resource).waiterPrefix()))
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	var p etcdPermits
	p.queueRead(resp.Kvs)
	out := make([]Waiter, 0, len(p.queue))
	for _, kv := range p.queue {
		v, _ := parsePlace(kv)
		info := ParseToken(v.Token)
		out = append(out, Waiter{Position: len(out) + 1, Since: info.Acquired, Caller: info, Live: true})
	}
	return out, nil
}

// waiterOf returns the resource of a place key, prefix{R}:queue:<id>.
func (l *Locker) waiterOf(key string) (string, bool) {
	i := strings.LastIndex(key, "}:queue:")
	if i < 0 {
		return "", false
	}
	return resourceOf(l.prefix, key[:i+1])
}
