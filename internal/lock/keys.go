package lock

import (
	"encoding/json"
	"strconv"
	"strings"
)

// keys are the Redis keys of one resource. They share the hash tag {resource}
// so that every script touching them runs on one Cluster slot.
type keys struct {
	lock   string // the token, with the lease's TTL (of permit k: base + ":p<k>")
	fence  string // the fencing counter (of permit k: ":fence:<k>")
	owners string // reentrancy: owner id -> hold count (of permit k: ":owners:<k>")
	queue  string // waiters of Acquire, in arrival order (see acquire.lua)
	base   string // the resource's own lock key, prefix{R}, whatever the permit
	floor  string // the fence floor of R's Cluster slot, prefix + "fences:{<slot tag>}" (slot.go)
	permit int    // the permit these keys are (0: the lock itself)
}

// permitKeys returns the keys of permit p of the resource of k (lua/lib.lua):
// permit 0 is the lock itself, permit p > 0 has keys of its own.
func (k keys) permitKeys(p int) keys {
	if p == k.permit {
		return k
	}
	b := k.base
	out := keys{lock: b, fence: b + ":fence", owners: b + ":owners", queue: k.queue, base: b, floor: k.floor, permit: p}
	if p > 0 {
		n := strconv.Itoa(p)
		out.lock, out.fence, out.owners = b+":p"+n, out.fence+":"+n, out.owners+":"+n
	}
	return out
}

// limitKey is the hash of a resource's limit (lua/lib.lua); on etcd, a key
// holding the limit alone.
func (k keys) limitKey() string { return k.base + ":limit" }

// progressKey is where the renewals of a holder that reports progress
// (StallAfter) leave its last progress: "<Unix ms> <token>", with the lock's
// TTL (lua/renew_batch.lua).
func (k keys) progressKey() string { return k.lock + ":progress" }

// rateKey is the key of a rate limit on the resource (lua/rate.lua): its
// theoretical arrival time, under the resource's hash tag.
func (k keys) rateKey() string { return k.base + ":rate" }

// fairKeys are the keys of a fair scope (lua/fair.lua): its state hash,
// its waiting tasks (zset by tag), their tenants and the started tasks not
// yet ended.
func (k keys) fairKeys() []string {
	f := k.base + ":fair"
	return []string{f, f + ":queue", f + ":tasks", f + ":started", f + ":onway"}
}

// turnKey is the turn a rate limit on the resource gave task (lua/rate.lua, Reserve).
func (k keys) turnKey(task string) string { return k.base + ":rate:task:" + task }

// permitPrefix is what the lock keys of permits k > 0 start with
// (prefix{R}:p): on etcd one range holds them all, and with the lock key
// itself they are the resource's permits.
func (k keys) permitPrefix() string { return k.base + ":p" }

// waiterKey is goroutine waiter id's key under the resource's queue,
// prefix{R}:queue:<id>: on Redis its hash (token, ttl, owner), on etcd its
// place in the queue (etcd_queue.go).
func (k keys) waiterKey(id string) string { return k.queue + ":" + id }

// waiterPrefix is what every waiter's key of the resource starts with.
func (k keys) waiterPrefix() string { return k.queue + ":" }

// ownersPrefix is what the reentrancy keys of every permit start with
// (prefix{R}:owners, then ":<k>" for a permit k > 0).
func (k keys) ownersPrefix() string { return k.base + ":owners" }

// permitOf returns the resource and permit of a permit's lock key,
// prefix{R} (permit 0) or prefix{R}:p<k>; ok is false for any other key.
func (l *Locker) permitOf(key string) (resource string, k int, ok bool) {
	if r, ok := resourceOf(l.prefix, key); ok {
		return r, 0, true
	}
	i := strings.LastIndex(key, "}:p")
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(key[i+len("}:p"):])
	if err != nil || n < 1 || strconv.Itoa(n) != key[i+len("}:p"):] {
		return "", 0, false
	}
	r, ok := resourceOf(l.prefix, key[:i+1])
	return r, n, ok
}

// limitOf returns the resource of a limit key, prefix{R}:limit.
func (l *Locker) limitOf(key string) (string, bool) {
	base, ok := strings.CutSuffix(key, ":limit")
	if !ok {
		return "", false
	}
	return resourceOf(l.prefix, base)
}

// keysFor is the one place lock keys are built: prefix + "{" + resource + "}".
// The four keys are cut from one string, and the floor is one more: two
// allocations per lease.
func (l *Locker) keysFor(resource string) keys {
	n := len(l.prefix) + len(resource) + 2 // prefix{resource}
	var b strings.Builder
	b.Grow(3*n + len(":fence:owners:queue"))
	for _, suffix := range [...]string{":fence", ":owners", ":queue"} {
		b.WriteString(l.prefix)
		b.WriteByte('{')
		b.WriteString(resource)
		b.WriteByte('}')
		b.WriteString(suffix)
	}
	all := b.String()
	f, o := n+len(":fence"), 2*n+len(":fence:owners")
	return keys{lock: all[:n], fence: all[:f], owners: all[f:o], queue: all[o:], base: all[:n], floor: l.floorKey(all[:n])}
}

// floorKey returns the fence floor of the Cluster slot of lock key: the key
// that a released resource's last fence is folded into (lua/lib.lua's
// retire), so that no key of the resource outlives its release. One per slot
// used, whatever the number of resources; it lives as long as a counter.
func (l *Locker) floorKey(lock string) string {
	return l.prefix + "fences:{" + slotTags()[hashSlot(lock)] + "}"
}

// FenceFloorKey returns the key of the fence floor that resource shares with
// every resource of its Cluster slot.
func (l *Locker) FenceFloorKey(resource string) string { return l.keysFor(resource).floor }

// Prefix is the Locker's key prefix (WithPrefix; "lockstep:" by default).
func (l *Locker) Prefix() string { return l.prefix }

// KeyPrefix is what every lock key of this Locker starts with (prefix + "{"):
// the prefix a server-notice subscription (client tracking) watches.
func (l *Locker) KeyPrefix() string { return l.prefix + "{" }

// Key returns the Redis key that holds the lock on resource.
func (l *Locker) Key(resource string) string { return l.keysFor(resource).lock }

// FenceKey returns the Redis key of resource's fencing counter, which lives
// while the resource is held (and, after an expiry, lock.fence_ttl more).
func (l *Locker) FenceKey(resource string) string { return l.keysFor(resource).fence }

// A resource's other keys and names, all under its hash tag:
//
//	prefix{R}:queue:W        a goroutine waiter's hash (token, ttl, owner); on etcd its place (waiterKey)
//	prefix{R}:queue:W:wake   its wake list
//	prefix{R}:done:<q>:<id>  a done marker: task id of queue q ran under a hand-off
//	prefix{R}:granted        the pub/sub channel of grants to parked tasks
//	prefix{R}:p<k>           permit k > 0 of a resource with a limit (permitKeys),
//	                         with prefix{R}:fence:<k> and prefix{R}:owners:<k>
//	prefix{R}:limit          the resource's limit: hash n (limit), h (permits to look at)
//	prefix{R}:rate           a rate limit on R (Allow): "<TAT> <T> <B>", its GCRA theoretical
//	                         arrival time (Unix µs) and the interval (µs) and burst it was
//	                         counted under; it expires once that time has passed
//	prefix{R}:rate:task:<t>  the turn a rate limit on R gave task t (Reserve): Unix µs; it
//	                         expires shortly after that turn
//	prefix{R}:fair           a fair scope R = FairScope(queue, type) (lua/fair.lua): its virtual
//	                         time and each waiting tenant's finish, backlog and stride; with
//	                         :fair:queue (waiting tasks by tag), :fair:tasks (their tenants)
//	                         :fair:started (started tasks not yet ended) and :fair:onway
//	                         (started tasks not yet delivered)
//
// The waiter queue's members are goroutine waiters (16 hex digits) and
// parked tasks, "t:" + JSON ["<queue>", "<task id>"] (TaskWaiter).

// TaskWaiter is the member that names the parked task id of queue among a
// resource's waiters.
func TaskWaiter(queue, id string) string {
	b, _ := json.Marshal([2]string{queue, id})
	return "t:" + string(b)
}

// ParseTaskWaiter is TaskWaiter's inverse; ok is false for a goroutine waiter.
func ParseTaskWaiter(m string) (queue, id string, ok bool) {
	rest, ok := strings.CutPrefix(m, "t:")
	var w [2]string
	if !ok || json.Unmarshal([]byte(rest), &w) != nil || w[1] == "" {
		return "", "", false
	}
	return w[0], w[1], true
}

// DoneKey returns the key of the done marker of task id of queue on resource.
func (l *Locker) DoneKey(resource, queue, id string) string {
	return l.keysFor(resource).lock + ":done:" + queue + ":" + id
}

// ScanPattern matches every key of this Locker's resources (SCAN MATCH).
func (l *Locker) ScanPattern() string { return globEscape(l.prefix) + "{*}" }

// LimitPattern matches the limit hash of every resource with permits
// (SCAN MATCH): a resource whose permit 0 is free may hold others.
func (l *Locker) LimitPattern() string { return globEscape(l.prefix) + "{*}:limit" }

// RateKey returns the key of the rate limit on key (Allow).
func (l *Locker) RateKey(key string) string { return l.keysFor(key).rateKey() }

// RatePattern matches the rate key of every key (SCAN MATCH).
func (l *Locker) RatePattern() string { return globEscape(l.prefix) + "{*}:rate" }

// rateOf returns the key of a rate key, prefix{K}:rate.
func (l *Locker) rateOf(key string) (string, bool) {
	base, ok := strings.CutSuffix(key, ":rate")
	if !ok {
		return "", false
	}
	return resourceOf(l.prefix, base)
}

func (l *Locker) grantsPattern() string { return globEscape(l.prefix) + "{*}:granted" }

// resourceOfGrants returns R for the channel prefix{R}:granted.
func (l *Locker) resourceOfGrants(channel string) (string, bool) {
	r, ok := strings.CutPrefix(channel, l.prefix+"{")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(r, "}:granted")
}

// globEscape escapes the glob characters of a pattern (SCAN, PSUBSCRIBE).
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// LossesKey is the stream of recent lock losses under this Locker's prefix
// (a job server's Registry writes it: RecordLoss; the operator's page reads
// it).
func (l *Locker) LossesKey() string { return l.prefix + "losses" }

// ScheduleRun returns the resource of a schedule's run lock (its overlap
// policy: the worker of a run holds it while the run runs) and that lock's
// key under prefix. The resource is "schedule:<name>", so the key,
// prefix{schedule:<name>}, shares the hash tag of the scheduler's keys of
// that schedule and one script can read both.
func ScheduleRun(prefix, schedule string) (resource, key string) {
	resource = "schedule:" + schedule
	return resource, (&Locker{prefix: prefix}).Key(resource)
}
