package lock

// keys are the Redis keys of one resource. They share the hash tag {resource}
// so that every script touching them runs on one Cluster slot.
type keys struct {
	lock   string // the token, with the lease's TTL
	fence  string // the fencing counter
	owners string // reentrancy: owner id -> hold count
	queue  string // waiters of Acquire, in arrival order (see acquire.lua)
}

// keysFor is the one place lock keys are built: prefix + "{" + resource + "}".
func (l *Locker) keysFor(resource string) keys {
	base := l.prefix + "{" + resource + "}"
	return keys{lock: base, fence: base + ":fence", owners: base + ":owners", queue: base + ":queue"}
}

// KeyPrefix is what every lock key of this Locker starts with (prefix + "{"):
// the prefix a server-notice subscription (client tracking) watches.
func (l *Locker) KeyPrefix() string { return l.prefix + "{" }

// Key returns the Redis key that holds the lock on resource.
func (l *Locker) Key(resource string) string { return l.keysFor(resource).lock }

// FenceKey returns the Redis key of resource's fencing counter.
func (l *Locker) FenceKey(resource string) string { return l.keysFor(resource).fence }
