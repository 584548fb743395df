package scheduler

import (
	"strconv"
	"strings"
)

// keys are the Redis keys of one schedule. They share the hash tag
// {schedule:<name>} so that every script touching them runs on one Cluster
// slot; schedule names cannot contain braces (config rejects them).
type keys struct {
	base    string // prefix + "{schedule:<name>}"
	state   string // hash: tick (the watermark), leader, a lease field per pending tick (pendingField), backfilledField
	history string // list of the latest ticks' records, newest first
}

// keysFor is the one place scheduler keys are built.
func keysFor(prefix, schedule string) keys {
	base := prefix + "{schedule:" + schedule + "}"
	return keys{base: base, state: base + ":state", history: base + ":history"}
}

// backfilledField of a schedule's state counts the ticks backfills enqueued
// that no replica has counted in its metrics yet (backfilled.lua).
const backfilledField = "backfilled"

// pendingPrefix starts the state field of each tick claimed and not yet
// done: "p:<T>" = "<lease end, Redis ms> <token>", the tick's leader lease.
const pendingPrefix = "p:"

// pendingField is the state field of the tick at Unix second t while it is pending.
func pendingField(t int64) string { return pendingPrefix + strconv.FormatInt(t, 10) }

// parsePending reads a pending field and its value: the tick, the lease's
// end (Redis ms) and the token; ok is false for the other fields of state.
func parsePending(field, value string) (tick, leaseEnd int64, token string, ok bool) {
	ts, found := strings.CutPrefix(field, pendingPrefix)
	if !found {
		return 0, 0, "", false
	}
	tick, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return 0, 0, "", false
	}
	end, token, _ := strings.Cut(value, " ")
	leaseEnd, _ = strconv.ParseInt(end, 10, 64)
	return tick, leaseEnd, token, true
}

// storeKeys are the keys of the run-time schedules. They share the hash tag
// {schedules}, so each change is one script on one Cluster slot.
type storeKeys struct {
	defs     string // hash: name -> definition (JSON) of each run-time schedule
	meta     string // hash: name -> {"since","paused","spec","updated_ms","paused_ms","resumed_ms"} (JSON), also for paused file schedules
	file     string // hash: name -> definition (JSON) of the file schedules replicas started with
	version  string // counter, incremented by every change
	channel  string // pub/sub channel: a change's new version, published by the change's script
	replicas string // zset: live scheduler replicas -> last heartbeat
	declared string // prefix of each replica's set of the file schedules it declares: declared + id
	claimed  string // prefix of each second's claim digests: claimed + T, hash: replica -> sum (claim.lua)
}

func storeKeysFor(prefix string) storeKeys {
	base := prefix + "{schedules}"
	return storeKeys{defs: base + ":defs", meta: base + ":meta", file: base + ":file",
		version: base + ":version", channel: base + ":changed", replicas: base + ":replicas", declared: base + ":file:",
		claimed: base + ":claimed:"}
}
