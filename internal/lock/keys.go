package lock

import "strings"

// keys are the Redis keys of one resource. They share the hash tag {resource}
// so that every script touching them runs on one Cluster slot.
type keys struct {
	lock   string // the token, with the lease's TTL
	fence  string // the fencing counter
	owners string // reentrancy: owner id -> hold count
	queue  string // waiters of Acquire, in arrival order (see acquire.lua)
}

// keysFor is the one place lock keys are built: prefix + "{" + resource + "}".
// The four keys are cut from one string: one allocation per lease.
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
	return keys{lock: all[:n], fence: all[:f], owners: all[f:o], queue: all[o:]}
}

// KeyPrefix is what every lock key of this Locker starts with (prefix + "{"):
// the prefix a server-notice subscription (client tracking) watches.
func (l *Locker) KeyPrefix() string { return l.prefix + "{" }

// Key returns the Redis key that holds the lock on resource.
func (l *Locker) Key(resource string) string { return l.keysFor(resource).lock }

// FenceKey returns the Redis key of resource's fencing counter.
func (l *Locker) FenceKey(resource string) string { return l.keysFor(resource).fence }

// ScheduleRun returns the resource of a schedule's run lock (its overlap
// policy: the worker of a run holds it while the run runs) and that lock's
// key under prefix. The resource is "schedule:<name>", so the key,
// prefix{schedule:<name>}, shares the hash tag of the scheduler's keys of
// that schedule and one script can read both.
func ScheduleRun(prefix, schedule string) (resource, key string) {
	resource = "schedule:" + schedule
	return resource, (&Locker{prefix: prefix}).Key(resource)
}
