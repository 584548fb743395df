package scheduler

import "strconv"

// keys are the Redis keys of one schedule. They share the hash tag
// {schedule:<name>} so that every script touching them runs on one Cluster
// slot; schedule names cannot contain braces (config rejects them).
type keys struct {
	base    string // prefix + "{schedule:<name>}"
	pending string // zset of ticks claimed and not yet done
	state   string // hash: tick (the watermark), leader
}

// keysFor is the one place scheduler keys are built.
func keysFor(prefix, schedule string) keys {
	base := prefix + "{schedule:" + schedule + "}"
	return keys{base: base, pending: base + ":pending", state: base + ":state"}
}

// tick is the leader lock of the tick at Unix second t.
func (k keys) tick(t int64) string { return k.base + ":tick:" + strconv.FormatInt(t, 10) }
