package scheduler

import "strconv"

// keys are the Redis keys of one schedule. They share the hash tag
// {schedule:<name>} so that every script touching them runs on one Cluster
// slot; schedule names cannot contain braces (config rejects them).
type keys struct {
	base    string // prefix + "{schedule:<name>}"
	pending string // zset of ticks claimed and not yet done
	state   string // hash: tick (the watermark), leader
	history string // list of the latest ticks' records, newest first
}

// keysFor is the one place scheduler keys are built.
func keysFor(prefix, schedule string) keys {
	base := prefix + "{schedule:" + schedule + "}"
	return keys{base: base, pending: base + ":pending", state: base + ":state", history: base + ":history"}
}

// tick is the leader lock of the tick at Unix second t.
func (k keys) tick(t int64) string { return k.base + ":tick:" + strconv.FormatInt(t, 10) }

// storeKeys are the keys of the run-time schedules. They share the hash tag
// {schedules}, so each change is one script on one Cluster slot.
type storeKeys struct {
	defs     string // hash: name -> definition (JSON) of each run-time schedule
	meta     string // hash: name -> {"since","paused","spec","updated_ms"} (JSON), also for paused file schedules
	file     string // hash: name -> definition (JSON) of the file schedules replicas started with
	version  string // counter, incremented by every change
	channel  string // pub/sub channel: a change's new version, published by the change's script
	replicas string // zset: live scheduler replicas -> last heartbeat
}

func storeKeysFor(prefix string) storeKeys {
	base := prefix + "{schedules}"
	return storeKeys{defs: base + ":defs", meta: base + ":meta", file: base + ":file",
		version: base + ":version", channel: base + ":changed", replicas: base + ":replicas"}
}
