package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Parked tasks among a resource's waiters: the job server's side of the one
// waiter queue (see lua/lib.lua). A task whose lock is busy joins the queue
// (Take) and goes back to its queue's retry set; a release hands the lock
// to the longest waiter, goroutine or task. A job's release (HandOn) hands
// a task head to the releasing worker, which takes it over (TakeOver) and
// runs it next; any other release grants it, and a job server that hears
// the grant (Grants) brings the task back at once. Only the single back end
// has the queue: Redlock's and etcd's locks live away from the queue's
// Redis, and their jobs use Acquire.

// ErrNoQueue is returned by the task operations of a back end without the
// waiter queue (Redlock, etcd, WaitReplicas).
var ErrNoQueue = errors.New("lock: this back end has no waiter queue for tasks")

// HasQueue reports whether the back end keeps the one waiter queue that
// tasks join and releases hand on from (the single back end without
// WaitReplicas: a hand-off is not followed by WAIT).
func (l *Locker) HasQueue() bool {
	_, err := l.redis()
	return err == nil
}

func (l *Locker) redis() (*single, error) {
	if b, ok := l.be.(*single); ok && b.fairWaiting() {
		return b, nil
	}
	return nil, ErrNoQueue
}

// Taken is Take's answer: a lease (acquired, or granted and taken over), an
// outcome (the task already ran under a hand-off), or busy.
type Taken struct {
	Lease   *Lease
	Granted bool   // the lease is a grant taken over
	Done    bool   // the task already ran under a hand-off: Outcome is its done marker
	Outcome string // "ok", "fail:<msg>" or "skip:<msg>"

	// Busy:
	PTTL   time.Duration // the lock's remaining TTL
	Ahead  int           // waiters before this task
	Joined time.Time     // the task joined the queue now, at this server time (zero: it had its place)
	Head   string        // this call granted the free lock to this task waiter ahead (to be woken)

	// With a TaskRate: Admitted is the admission's time on the limit's
	// schedule (now, or the turn the task took) when it got the lock; over
	// the rate, RateWait > 0 is the wait until its turn at RateTurn (the
	// lock or a permit is granted to the task until then, nothing taken).
	Admitted time.Time
	RateWait time.Duration
	RateTurn time.Time
	// Waited (TakeOver): over its rate by this much, the task waited for
	// its turn in the caller's slot, holding the lock.
	Waited time.Duration
}

// TaskRate is a task's rate limit, decided with its lock by Take (one
// admission, lua/take.lua): the limit Rate on Key, the task's turn (taken
// when over it) admitted up to Late after it, as Reserve's.
type TaskRate struct {
	Key  string
	Rate Rate
	Late time.Duration
}

// OneAdmission reports whether Take can decide a rate limit on key together
// with resource's lock in one call: the single back end with the waiter
// queue, on one server (Sentinel too), or on a Cluster when the rate's key
// and the resource's share a slot (one hash tag, for instance).
func (l *Locker) OneAdmission(key, resource string) bool {
	b, err := l.redis()
	if err != nil {
		return false
	}
	return b.oneNode() || hashSlot(l.keysFor(key).rateKey()) == hashSlot(l.keysFor(resource).lock)
}

// Take asks for resource's lock for the task id of queue, in one call: it
// is acquired, or was granted to the task, or the task already ran (its
// done marker), or it is busy; then, with join, the task keeps or takes its
// place in the waiter queue, which outlives its last join by queueTTL.
// When holds is not "" (HoldsKey of this process), a lock taken adds the
// task's hold record to it (HoldRecord), and a task that joins the queue
// its bare record (HoldRecord with no resource), for a recoverer to find. limit is
// the task's limit (1: a lock; see Permits); the lease says which permit.
//
// With rate (not nil; OneAdmission must hold), the task's rate limit is
// decided in the same call, only when the lock would be given to the task:
// a task that waits for its lock spends no turn of its rate, and one over
// its rate takes no lock but its turn (RateWait), the lock granted to it
// until then so that it takes both over when it asks again on that turn.
func (l *Locker) Take(ctx context.Context, resource, queue, id string, ttl, queueTTL time.Duration, join bool, holds string, limit int, rate *TaskRate) (Taken, error) {
	b, err := l.redis()
	if err != nil {
		return Taken{}, err
	}
	if err := l.CheckLimit(limit); err != nil {
		return Taken{}, fmt.Errorf("lock: acquire %q: %w", resource, err)
	}
	if rate != nil {
		if err := rate.Rate.Check(); err != nil {
			return Taken{}, fmt.Errorf("lock: acquire %q: %w", resource, err)
		}
		if !l.OneAdmission(rate.Key, resource) {
			return Taken{}, fmt.Errorf("lock: acquire %q: its rate key %q is in another Cluster slot: ask the rate first (Reserve)", resource, rate.Key)
		}
	}
	k := l.keysFor(resource)
	sent := time.Now()
	token := tokenFor(ctx, sent)
	mode := "n"
	if join {
		mode = "q"
	}
	keys := []string{k.lock, k.fence, k.owners, k.queue, l.DoneKey(resource, queue, id), k.floor}
	record := HoldRecord(resource, queue, id)
	args := []any{token, ttl.Milliseconds(), counterTTL(ttl, b.fenceTTL), TaskWaiter(queue, id), queueTTL.Milliseconds(), mode, record, limit}
	if rate != nil {
		rk := l.keysFor(rate.Key)
		keys = append(keys, rk.rateKey(), rk.turnKey(queue+":"+id))
		args = append(args, rate.Rate.interval(), rate.Rate.burst(), max(rate.Late.Microseconds(), 0))
	}
	if holds != "" && b.oneNode() {
		keys = append(keys, holds)
	}
	v, err := run(ctx, b.client, scriptTake, keys, args...)
	l.metrics.LockAcquireDuration.Observe(time.Since(sent).Seconds())
	if err != nil {
		l.failed.Inc()
		return Taken{}, fmt.Errorf("lock: acquire %q: %w", resource, err)
	}
	vals, _ := v.([]any)
	if len(vals) < 2 {
		l.failed.Inc()
		return Taken{}, fmt.Errorf("lock: acquire %q: unexpected reply %v", resource, v)
	}
	switch vals[0] {
	case int64(1), int64(2):
		tok, _ := vals[1].(string)
		var fence, permit int64
		if len(vals) > 2 {
			fence, _ = vals[2].(int64)
		}
		if len(vals) > 3 {
			permit, _ = vals[3].(int64)
		}
		if len(vals) > 4 { // a permit's grant taken over: the task waited since its arrival
			l.observeWait(vals[4])
		}
		var admitted time.Time
		if len(vals) > 5 {
			if s, _ := vals[5].(string); s != "" {
				us, _ := strconv.ParseInt(s, 10, 64)
				admitted = time.UnixMicro(us)
			}
		}
		l.acquired.Inc()
		if holds != "" && !b.oneNode() {
			// On a Cluster the holds set lives in another slot than the
			// lock: the record replaces the bare one as take.lua does.
			if _, err := b.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.SAdd(ctx, holds, record)
				p.SRem(ctx, holds, HoldRecord("", queue, id))
				return nil
			}); err != nil {
				return Taken{}, fmt.Errorf("lock: record the hold of %q: %w", resource, err)
			}
		}
		return Taken{Lease: l.adopt(resource, int(permit), tok, fence, ttl, sent), Granted: vals[0] == int64(2), Admitted: admitted}, nil
	case int64(3):
		out, _ := vals[1].(string)
		return Taken{Done: true, Outcome: out}, nil
	case int64(5):
		wait, _ := vals[1].(int64)
		turn, _ := vals[2].(int64)
		return Taken{RateWait: time.Duration(wait) * time.Microsecond, RateTurn: time.UnixMicro(turn)}, nil
	case int64(0), int64(4):
		l.busy.Inc()
		if join && holds != "" && !b.oneNode() {
			// The task's bare record, as take.lua writes it on one node.
			if err := b.client.SAdd(ctx, holds, HoldRecord("", queue, id)).Err(); err != nil {
				return Taken{}, fmt.Errorf("lock: record the wait of %q: %w", resource, err)
			}
		}
		var t Taken
		if len(vals) >= 4 {
			p, _ := vals[1].(int64)
			a, _ := vals[3].(int64)
			t.PTTL, t.Ahead = time.Duration(p)*time.Millisecond, int(a)
			if s, _ := vals[2].(string); s != "" {
				us, _ := strconv.ParseInt(s, 10, 64)
				t.Joined = time.UnixMicro(us)
			}
		}
		if len(vals) == 5 {
			t.Head, _ = vals[4].(string)
		}
		return t, nil
	}
	l.failed.Inc()
	return Taken{}, fmt.Errorf("lock: acquire %q: unexpected reply %v", resource, v)
}

// HandOff says what a job's release does besides releasing.
type HandOff struct {
	// Chain: a task at the head of the queue is handed to the caller, to
	// run next under the returned TaskGrant (else it is granted).
	Chain bool
	// Queue and ID name the task that just ran ("" when none did: a pass).
	Queue, ID string
	// Outcome marks the finished task done ("ok", "fail:..."; "" for none),
	// always (MarkAlways) or only when the caller runs the next task.
	Outcome    string
	MarkAlways bool
	MarkerTTL  time.Duration
	// Drop is a done marker (DoneKey) to delete in the same call; Keep one
	// whose life to extend to MarkerTTL (the delivered task of a chain).
	Drop, Keep string
	// RecoveryTTL, when not 0, marks the finished task done for that long
	// also when it is not marked above: a recoverer that finds this
	// process dead before asynq completed the task replays the outcome.
	RecoveryTTL time.Duration
	// Holds (HoldsKey of this process) gets the hold record of a task
	// handed on for the caller to run.
	Holds string
}

// HandedOn is what HandOn did.
type HandedOn struct {
	Next    *TaskGrant // the caller holds the lock for this task now
	Marker  string     // the finished task's done marker (DoneKey), when the release marked it done
	Dropped bool       // Drop was deleted
}

// TaskGrant is a lock handed on to a parked task, held under Token.
type TaskGrant struct {
	Resource  string
	Permit    int       // the permit handed on (0: the lock itself)
	Since     time.Time // a permit's: when the task joined the queue (server clock); zero for a lock
	Member    string    // the waiter (TaskWaiter)
	Queue, ID string
	Token     string
	Fence     int64
	TTL       time.Duration
	Sent      time.Time
}

// HandOn releases lease and hands the lock to the longest waiter in the
// same step (handon.lua). It ends the lease: released, or lost when the key
// is gone or holds another token (a *LostError, also returned). A lease
// already lost is released by its token alone (Release).
func (l *Locker) HandOn(ctx context.Context, lease *Lease, h HandOff) (HandedOn, error) {
	if lease.Err() != nil {
		return HandedOn{}, lease.Release(ctx)
	}
	b, err := l.redis()
	if err != nil {
		return HandedOn{}, err
	}
	k := lease.keys
	marker := k.base + ":done:"
	outcome := ""
	if h.ID != "" {
		marker, outcome = l.DoneKey(lease.resource, h.Queue, h.ID), h.Outcome
	}
	drop, dropFlag := k.base+":done:", ""
	if h.Drop != "" {
		drop, dropFlag = h.Drop, "1"
	}
	keep := ""
	if strings.HasPrefix(h.Keep, k.base) { // one of this resource's markers: its slot
		keep = h.Keep
	}
	sent := time.Now()
	next := ""
	if h.Chain {
		next = chainStart(sent) // this process holds next; the script completes it for the task it picks
	}
	mark := "g"
	if h.MarkAlways {
		mark = "a"
	}
	keys := []string{k.lock, k.fence, k.owners, k.queue, marker, drop, k.floor}
	if h.Holds != "" && b.oneNode() {
		keys = append(keys, h.Holds)
	}
	recovery := ""
	if h.RecoveryTTL > 0 {
		recovery = strconv.FormatInt(h.RecoveryTTL.Milliseconds(), 10)
	}
	v, err := run(ctx, b.client, scriptHandOn, keys,
		lease.token, next, lease.ttl.Milliseconds(), counterTTL(lease.ttl, b.fenceTTL), outcome, mark, h.MarkerTTL.Milliseconds(), dropFlag,
		recovery, lease.resource+"\n", k.permit, keep)
	if err != nil {
		return HandedOn{}, fmt.Errorf("lock: release %q: %w", lease.resource, err)
	}
	vals, _ := v.([]any)
	if len(vals) == 0 {
		return HandedOn{}, fmt.Errorf("lock: release %q: unexpected reply %v", lease.resource, v)
	}
	switch status, _ := vals[0].(int64); status {
	case 0:
		return HandedOn{}, lease.MarkLost(ReasonExpired)
	case -1:
		return HandedOn{}, lease.MarkLost(ReasonStolen)
	case 2:
		if len(vals) < 3 {
			return HandedOn{}, fmt.Errorf("lock: release %q: unexpected reply %v", lease.resource, v)
		}
		lease.state.set(errReleased)
		m, _ := vals[1].(string)
		fence, _ := vals[2].(int64)
		var permit int64
		if len(vals) > 3 {
			permit, _ = vals[3].(int64)
		}
		g := &TaskGrant{Resource: lease.resource, Permit: int(permit), Member: m, Fence: fence, TTL: lease.ttl, Sent: sent}
		if len(vals) > 4 {
			g.Since = l.observeWait(vals[4])
		}
		g.Queue, g.ID, _ = ParseTaskWaiter(m)
		g.Token = chainToken(next, g.ID)
		if h.Holds != "" && !b.oneNode() {
			if err := b.client.SAdd(ctx, h.Holds, HoldRecord(g.Resource, g.Queue, g.ID)).Err(); err != nil {
				return HandedOn{}, fmt.Errorf("lock: record the hold of %q: %w", lease.resource, err)
			}
		}
		r := HandedOn{Next: g, Dropped: dropFlag != ""}
		if outcome != "" {
			r.Marker = marker
		}
		return r, nil
	default:
		lease.state.set(errReleased)
		// Marked done also when RecoveryTTL is set: the caller forgets the
		// marker once asynq has recorded the task, or it outlives the task
		// by that TTL.
		r := HandedOn{Dropped: dropFlag != ""}
		if outcome != "" && (h.MarkAlways || h.RecoveryTTL > 0) {
			r.Marker = marker
		}
		return r, nil
	}
}

// observeWait records the wait of a task for a permit since its arrival in
// the queue, v (server µs, as a script's string; "" unknown), and returns
// the arrival.
func (l *Locker) observeWait(v any) time.Time {
	s, _ := v.(string)
	us, err := strconv.ParseInt(s, 10, 64)
	if err != nil || us <= 0 {
		return time.Time{}
	}
	at := time.UnixMicro(us)
	l.metrics.PermitWait.Observe(max(time.Since(at), 0).Seconds())
	return at
}

// Adopt returns the lease of a TaskGrant, for the task it was handed to.
func (l *Locker) Adopt(g *TaskGrant, ttl time.Duration) *Lease {
	return l.adopt(g.Resource, g.Permit, g.Token, g.Fence, ttl, g.Sent)
}

// TakeOver takes over g, a lock handed on to the caller (HandOn) for its
// task to run next, in one call, as Take takes a grant over for a delivered
// task: its lease, with ttl (at most g's). HandOn recorded the task's hold
// in the caller's holds set already.
//
// With rate (the task's Take would have decided it with the lock:
// OneAdmission), its rate limit is decided first, one admission as Take's:
// admitted now, the lease is returned (Admitted); its turn at most
// min(rate.Late, ttl/2) away, the lock is renewed once (the watchdog renews
// it only once the task runs) and the next turn is waited for here, holding
// the lock (the task is the first waiter anyway; Waited); further off, or
// when the rate or the lock cannot be asked, Lease is nil (RateWait: how far
// its turn is) and the caller leaves the task to asynq with the lock granted
// to it (Grant): its Take decides then.
func (l *Locker) TakeOver(ctx context.Context, g *TaskGrant, ttl time.Duration, rate *TaskRate) (Taken, error) {
	lease := l.Adopt(g, ttl)
	if rate == nil {
		return Taken{Lease: lease, Granted: true}, nil
	}
	bound := min(rate.Late, ttl/2)
	wait, at, err := l.AllowAt(ctx, rate.Key, rate.Rate)
	switch {
	case err != nil:
		return Taken{}, err
	case wait == 0:
		return Taken{Lease: lease, Granted: true, Admitted: at}, nil
	case wait > bound:
		return Taken{RateWait: wait}, nil
	}
	if err := lease.Renew(ctx); err != nil {
		return Taken{}, err
	}
	// Its turn is the next one free: later than wait if another took that
	// one meanwhile, and then, past the bound, counted and left unused.
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if at, err = l.WaitAllow(wctx, rate.Key, rate.Rate); err != nil {
		return Taken{Waited: wait}, err
	}
	return Taken{Lease: lease, Granted: true, Admitted: at, Waited: wait}, nil
}

func (l *Locker) adopt(resource string, permit int, token string, fence int64, ttl time.Duration, sent time.Time) *Lease {
	return &Lease{locker: l, keys: l.keysFor(resource).permitKeys(permit), resource: resource,
		token: token, fence: fence, ttl: ttl, sent: sent, limit: 1}
}

// Grant leaves the lock of g, which the caller holds, to g's task for asynq
// to deliver (grant.lua): the task's Take takes it over. It reports false
// when the lock no longer holds g's token.
func (l *Locker) Grant(ctx context.Context, g *TaskGrant) (bool, error) {
	b, err := l.redis()
	if err != nil {
		return false, err
	}
	fence := strconv.FormatInt(g.Fence, 10)
	switch { // the grant of a permit names it (lua/lib.lua's handoff)
	case !g.Since.IsZero():
		fence += "/" + strconv.Itoa(g.Permit) + "/" + strconv.FormatInt(g.Since.UnixMicro(), 10)
	case g.Permit > 0:
		fence += "/" + strconv.Itoa(g.Permit)
	}
	v, err := run(ctx, b.client, scriptGrant, []string{l.keysFor(g.Resource).permitKeys(g.Permit).lock}, g.Token, g.Member, g.TTL.Milliseconds(), fence)
	if err != nil {
		return false, fmt.Errorf("lock: grant %q: %w", g.Resource, err)
	}
	return v == int64(1), nil
}

// GrantNotice is a grant of a free lock to a parked task, heard on
// prefix{R}:granted.
type GrantNotice struct {
	Resource  string
	Permit    int // the permit granted (0: the lock itself)
	Queue, ID string
	value     string // the lock's value while granted: "g:<member>:<fence>[/<permit>]"
}

func parseGrantNotice(l *Locker, channel, payload string) (GrantNotice, bool) {
	r, ok := l.resourceOfGrants(channel)
	rest, ok2 := strings.CutPrefix(payload, "g:")
	i := strings.LastIndexByte(rest, ':')
	if !ok || !ok2 || i < 0 {
		return GrantNotice{}, false
	}
	permit := 0
	if _, k, found := strings.Cut(rest[i+1:], "/"); found { // "<fence>/<k>[/<arrival>]"
		k, _, _ = strings.Cut(k, "/")
		n, err := strconv.Atoi(k)
		if err != nil || n < 0 {
			return GrantNotice{}, false
		}
		permit = n
	}
	q, id, ok := ParseTaskWaiter(rest[:i])
	return GrantNotice{Resource: r, Permit: permit, Queue: q, ID: id, value: payload}, ok
}

// Grants calls f for every grant to a parked task, on any resource of this
// Locker, until ctx ends; the caller brings the task back (or Passes the
// grant when the task is gone). A grant whose notice is missed is taken
// over when the task comes back with its backoff.
func (l *Locker) Grants(ctx context.Context, f func(GrantNotice)) error {
	b, err := l.redis()
	if err != nil {
		return err
	}
	sub := b.client.PSubscribe(ctx, l.grantsPattern())
	if _, err := sub.Receive(ctx); err != nil {
		_ = sub.Close()
		return fmt.Errorf("lock: subscribe to grants: %w", err)
	}
	go func() {
		defer sub.Close()
		ch := sub.Channel(redis.WithChannelSize(256))
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				if n, ok := parseGrantNotice(l, m.Channel, m.Payload); ok {
					f(n)
				}
			}
		}
	}()
	return nil
}

// Pass releases a grant whose task is gone (deleted, completed): the lock
// goes on to the next waiter.
func (l *Locker) Pass(ctx context.Context, n GrantNotice, ttl time.Duration) error {
	return l.adopt(n.Resource, n.Permit, n.value, 0, ttl, time.Now()).Release(ctx)
}

// Waiter is one waiter of a resource, in the order they are served.
type Waiter struct {
	Position int       // 1 is served first
	Since    time.Time // arrival, by the server's clock (etcd: the waiter's, at its first attempt)
	// A parked task:
	Queue, TaskID string
	// A goroutine waiting in Acquire (WithLock):
	Caller TokenInfo // what its token says (holder, job); zero when its hash expired
	Live   bool      // a task, or a goroutine waiter whose hash is alive
}

// Waiters returns resource's waiters in the order a release serves them.
// Redlock has no queue: none.
func (l *Locker) Waiters(ctx context.Context, resource string) ([]Waiter, error) {
	if e, ok := l.be.(*etcdBackend); ok {
		return e.waiters(ctx, l, resource)
	}
	b, err := l.redis()
	if err != nil {
		return nil, nil
	}
	k := l.keysFor(resource)
	zs, err := b.client.ZRangeWithScores(ctx, k.queue, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	out := make([]Waiter, len(zs))
	tokens := make([]*redis.StringCmd, len(zs))
	_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range zs {
			m, _ := z.Member.(string)
			w := &out[i]
			w.Position, w.Since = i+1, time.UnixMicro(int64(z.Score))
			if q, id, ok := ParseTaskWaiter(m); ok {
				w.Queue, w.TaskID, w.Live = q, id, true
			} else {
				tokens[i] = p.HGet(ctx, k.waiterKey(m), "token")
			}
		}
		return nil
	})
	for i, c := range tokens {
		if c != nil && c.Err() == nil {
			out[i].Caller, out[i].Live = ParseToken(c.Val()), true
		}
	}
	return out, nil
}

// QueueKey returns the key of resource's waiter queue (for counting).
func (l *Locker) QueueKey(resource string) string { return l.keysFor(resource).queue }

// Recovery of a dead process's jobs. A job server records every task it
// takes a lock for in its process's holds set (HoldsKey), and beats in the
// processes zset (ProcessesKey) while it lives. Once a process stops
// beating, another one reads its hold records; a record whose lock that
// process no longer holds (HeldBy: it expired, since the process is gone,
// or it was released) names a task to bring back now, not after asynq's own
// lease. Recovery costs nothing per held lock: only the beats, and the
// records' adds and removes, once per job.

// HoldRecord is the member of a holds set for the task id of queue on resource.
func HoldRecord(resource, queue, id string) string { return resource + "\n" + TaskWaiter(queue, id) }

// ParseHoldRecord is HoldRecord's inverse.
func ParseHoldRecord(m string) (resource, queue, id string, ok bool) {
	r, w, ok := strings.Cut(m, "\n")
	if !ok {
		return "", "", "", false
	}
	queue, id, ok = ParseTaskWaiter(w)
	return r, queue, id, ok
}

// HoldsKey is the holds set of process (host:pid).
func (l *Locker) HoldsKey(process string) string { return l.prefix + "holds:" + process }

// ProcessesKey is the zset of job server processes by the deadline of their
// last beat (Unix ms).
func (l *Locker) ProcessesKey() string { return l.prefix + "processes" }

// HeldBy reports whether resource's lock, or one of its permits, is held by
// a token of process.
func (l *Locker) HeldBy(ctx context.Context, resource, process string) (bool, error) {
	b, err := l.redis()
	if err != nil {
		// Redlock, etcd: the lock as the back end's inspector reads it.
		h, err := l.Held(ctx, resource)
		if err != nil {
			return false, err
		}
		return h != nil && ParseToken(h.Token).Holder == process, nil
	}
	holds, _, err := l.permitsOn(ctx, b.client, resource)
	if err != nil {
		return false, fmt.Errorf("lock: read %q: %w", resource, err)
	}
	for _, v := range holds {
		if v != "" && ParseToken(v).Holder == process {
			return true, nil
		}
	}
	return false, nil
}

// permitsOn reads the values of resource's permits that may be held: one for
// a lock, the limit hash's h for a limited resource ("" for a free one), and
// the resource's limit (1 for a lock).
func (l *Locker) permitsOn(ctx context.Context, c redis.Cmdable, resource string) ([]string, int, error) {
	k := l.keysFor(resource)
	var lock *redis.StringCmd
	var lim *redis.SliceCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		lock = p.Get(ctx, k.lock)
		lim = p.HMGet(ctx, k.limitKey(), "n", "h")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, err
	}
	n, h := 1, 1
	if v := lim.Val(); len(v) == 2 && v[0] != nil {
		n, _ = strconv.Atoi(fmt.Sprint(v[0]))
		h, _ = strconv.Atoi(fmt.Sprint(v[1]))
		h = max(h, 1)
	}
	out := make([]string, h)
	out[0] = lock.Val()
	if h > 1 {
		cmds := make([]*redis.StringCmd, h)
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := 1; i < h; i++ {
				cmds[i] = p.Get(ctx, k.permitKeys(i).lock)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, 0, err
		}
		for i := 1; i < h; i++ {
			out[i] = cmds[i].Val()
		}
	}
	return out, max(n, 1), nil
}

// PermitKey returns the key of permit k of resource (permit 0: Key).
func (l *Locker) PermitKey(resource string, k int) string {
	return l.keysFor(resource).permitKeys(k).lock
}

// PermitFenceKey returns the fencing counter's key of permit k of resource.
func (l *Locker) PermitFenceKey(resource string, k int) string {
	return l.keysFor(resource).permitKeys(k).fence
}

// Front puts the task id of queue first in resource's one queue
// (front.lua): a dead holder's task that a recoverer brings back came before
// every waiter there, so it runs again as soon as the lock is free (G6,
// G7). The queue outlives it by queueTTL. It returns how many waiters it
// went ahead of. A task that is not brought back after all leaves with
// Unfront.
func (l *Locker) Front(ctx context.Context, resource, queue, id string, queueTTL time.Duration) (int, error) {
	b, err := l.redis()
	if err != nil {
		return 0, err
	}
	v, err := run(ctx, b.client, scriptFront, []string{l.keysFor(resource).queue}, TaskWaiter(queue, id), queueTTL.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("lock: front of %q: %w", resource, err)
	}
	n, _ := v.(int64)
	return int(n), nil
}

// Unfront takes back a Front whose task was not brought back: the task
// leaves the queue.
func (l *Locker) Unfront(ctx context.Context, resource, queue, id string) error {
	b, err := l.redis()
	if err != nil {
		return err
	}
	if err := b.client.ZRem(ctx, l.keysFor(resource).queue, TaskWaiter(queue, id)).Err(); err != nil {
		return fmt.Errorf("lock: unfront %q: %w", resource, err)
	}
	return nil
}

// Waiting reports whether task id of queue waits for resource: parked among
// its waiters, or granted one of its first limit permits and not taken over
// yet. One read-only round trip. A job with a rate limit asks it before its
// rate: a task that joined the waiters was admitted by its rate already, and
// asking again would only delay a task the lock is, or will be, granted to.
func (l *Locker) Waiting(ctx context.Context, resource, queue, id string, limit int) (bool, error) {
	b, err := l.redis()
	if err != nil {
		return false, err
	}
	k := l.keysFor(resource)
	member := TaskWaiter(queue, id)
	locks := make([]string, max(limit, 1))
	for p := range locks {
		locks[p] = k.permitKeys(p).lock
	}
	var score *redis.FloatCmd
	var held *redis.SliceCmd
	_, err = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		score = p.ZScore(ctx, k.queue, member)
		held = p.MGet(ctx, locks...)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("lock: waiting %q: %w", resource, err)
	}
	if score.Err() == nil {
		return true, nil
	}
	grant := "g:" + member + ":"
	for _, v := range held.Val() {
		if s, ok := v.(string); ok && strings.HasPrefix(s, grant) {
			return true, nil
		}
	}
	return false, nil
}
