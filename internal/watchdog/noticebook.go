package watchdog

import (
	"errors"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// noticeGrace is how long after our own write of a key its notice is still
// expected. Notices arrive within a round trip; an expectation that outlives
// this is dropped, so a miscount can hide a foreign change for at most this
// long before the next notice or renewal shows it.
const noticeGrace = 500 * time.Millisecond

// recentWindow is how long notices on keys not (yet) held are remembered, so a
// hold registered just after its acquire's notice arrived can tell.
const recentWindow = 2 * time.Second

// expectation is one notice we caused (an acquire or a renewal); until is
// zero while the write's answer is still on its way.
type expectation struct{ until time.Time }

// noticeBook tells the notices our own writes cause (a renewal modifies the
// key too) from the ones that need a check. Guarded by Watchdog.mu.
type noticeBook struct {
	expected map[string][]*expectation
	recent   map[string][]time.Time // arrivals of notices on keys not held
	purged   time.Time
}

func newNoticeBook() noticeBook {
	return noticeBook{expected: map[string][]*expectation{}, recent: map[string][]time.Time{}}
}

func (b *noticeBook) expect(key string, until time.Time) *expectation {
	e := &expectation{until: until}
	b.expected[key] = append(b.expected[key], e)
	return e
}

// consume reports whether a notice on key is explained by a write of ours.
func (b *noticeBook) consume(key string, now time.Time) bool {
	list := b.expected[key]
	live := list[:0]
	for _, e := range list {
		if e.until.IsZero() || now.Before(e.until) {
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		delete(b.expected, key)
		return false
	}
	b.expected[key] = live[1:]
	return true
}

func (b *noticeBook) drop(key string, e *expectation) {
	list := b.expected[key]
	for i, x := range list {
		if x == e {
			b.expected[key] = append(list[:i:i], list[i+1:]...)
			return
		}
	}
}

func (b *noticeBook) forget(key string) { delete(b.expected, key) }

func (b *noticeBook) clear() { clear(b.expected) }

// saw records a notice on a key no hold is on.
func (b *noticeBook) saw(key string, now time.Time) {
	if now.Sub(b.purged) > recentWindow {
		for k, ts := range b.recent {
			if now.Sub(ts[len(ts)-1]) > recentWindow {
				delete(b.recent, k)
			}
		}
		b.purged = now
	}
	ts := append(b.recent[key], now)
	if len(ts) > 4 {
		ts = ts[len(ts)-4:]
	}
	b.recent[key] = ts
}

// seenSince counts notices on key that arrived at or after t.
func (b *noticeBook) seenSince(key string, t time.Time) int {
	n := 0
	for _, at := range b.recent[key] {
		if !at.Before(t) {
			n++
		}
	}
	delete(b.recent, key)
	return n
}

// onNotice is the Notifier's callback: a change nobody expected makes the
// leases on that key due for renewal now, and the renewal decides.
func (w *Watchdog) onNotice(keys []string, all bool) {
	now := time.Now()
	due := false
	w.mu.Lock()
	if all {
		w.notices.clear()
		for h := range w.holds {
			h.next = now
			due = true
		}
	}
	for _, key := range keys {
		on := w.byKey[key]
		if len(on) == 0 {
			w.notices.saw(key, now)
			continue
		}
		if w.notices.consume(key, now) {
			continue
		}
		for _, h := range on {
			h.next = now
			due = true
		}
	}
	w.mu.Unlock()
	if due {
		w.metrics.LockNotices.Inc()
		w.poke()
	}
}

// onLoss is the callback of a back end that tells a loss itself (etcd's
// watch): the lease is already marked lost; end its hold now.
func (w *Watchdog) onLoss(lease *lock.Lease, err error) {
	var lost *lock.LostError
	if !errors.As(err, &lost) {
		return
	}
	w.mu.Lock()
	var found *Hold
	for _, h := range w.byKey[lease.RedisKey()] {
		if h.lease == lease {
			found = h
		}
	}
	w.mu.Unlock()
	if found != nil {
		found.lose(lost.Reason)
	}
}

// expectRenewal records that renewing h will cause one notice on its key.
func (w *Watchdog) expectRenewal(h *Hold) *expectation {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.notice.running() {
		return nil
	}
	return w.notices.expect(h.lease.RedisKey(), time.Time{})
}

// settleExpectations keeps the expectation of each renewal that wrote its key
// for a grace period, and drops the others (a lost lease's script wrote
// nothing; a transport error may or may not have: a notice then costs at most
// one extra renewal).
func (w *Watchdog) settleExpectations(leases []*lock.Lease, expected []*expectation, results []error) {
	until := time.Now().Add(noticeGrace)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, e := range expected {
		if e == nil { // no notifier ran when the round was sent
			continue
		}
		if results[i] == nil {
			e.until = until
		} else {
			w.notices.drop(leases[i].RedisKey(), e)
		}
	}
}
