package scheduler

import (
	"context"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A follower (a replica that is not a tick's first claimer) checks after
// claimGrace whether the first claimer claimed the tick. Outside a Cluster
// it does so with one read per first claimer and second, not one per tick:
// each first claimer's claim call adds the digests of the schedules whose
// tick T it claimed to P{schedules}:claimed:<T> (claim.lua; a digest is a
// 48-bit hash of the name, and the sum is modulo 2^48), and a follower
// compares that sum with the one it computes over the schedules due at T
// that it expects that replica to claim. Equal, every one of those ticks is
// at or behind its watermark, which is what a per-tick check would find.
// Different (the replicas saw different live sets or schedules, a claim is
// still on its way, a retried claim counted twice), each tick is checked
// on its own, as in a Cluster. Two different sets of schedules have the same
// sum with probability 2^-48.

const (
	digestMask = 1<<48 - 1
	// digestTTL is how long a second's claim digests are kept: followers
	// read them claimGrace after the second, and a claim is retried for
	// max_clock_skew + 1s at most.
	digestTTL = time.Minute
	// followViews is how many seconds of follower views a replica keeps.
	followViews = 64
	// followReads is how many times a follower reads a digest that is not
	// the expected one, claimGrace apart, before it checks each tick (a
	// missing one: twice).
	followReads = 5
)

// nameDigest is a schedule's digest: a 48-bit hash of its name.
func nameDigest(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return mix(h.Sum64()) & digestMask
}

// followView is a replica's view, as a follower, of one second T: which
// first claimer it expects for each schedule due at T, and whether each
// first claimer's digest matched.
type followView struct {
	once    sync.Once
	owner   map[string]string // schedule due at T -> its first claimer (not this replica)
	claimed map[string]bool   // first claimer -> its claim digest of T is the expected one
}

// claimedByFirst reports whether e's tick t is known to be claimed by its
// first claimer from the claim digests; false means "check the tick".
func (s *Scheduler) claimedByFirst(ctx context.Context, e *entry, t time.Time) bool {
	if s.digests == "" {
		return false
	}
	tick := t.Unix()
	s.followMu.Lock()
	v := s.follow[tick]
	if v == nil {
		v = &followView{}
		s.follow[tick] = v
		for old := range s.follow {
			if old <= tick-followViews {
				delete(s.follow, old)
			}
		}
	}
	s.followMu.Unlock()
	v.once.Do(func() { s.loadFollowView(ctx, v, t) })
	o, ok := v.owner[e.name]
	return ok && v.claimed[o]
}

// loadFollowView computes the expected digests of second t and reads the
// first claimers' ones, in one pipeline.
func (s *Scheduler) loadFollowView(ctx context.Context, v *followView, t time.Time) {
	live := s.replicas.Load()
	sums := map[string]uint64{}
	v.owner = map[string]string{}
	for _, e := range s.liveEntries() {
		if !e.spec.Next(t.Add(-time.Nanosecond)).Equal(t) {
			continue
		}
		o, ok := s.owner(e.name, live)
		if !ok || o == s.id {
			continue
		}
		v.owner[e.name] = o
		sums[o] = (sums[o] + e.digest) & digestMask
	}
	if len(sums) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.lateAfter)
	defer cancel()
	key := s.digests + strconv.FormatInt(t.Unix(), 10)
	v.claimed = map[string]bool{}
	// A first claimer whose digest is there but differs is most likely
	// still claiming (a loaded machine): its digest is read again, up to
	// followReads times claimGrace apart. One whose digest is missing after
	// two reads is taken for dead, or for not knowing these schedules.
	missing := map[string]int{}
	for attempt := range followReads {
		if attempt > 0 {
			tm := time.NewTimer(claimGrace)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return
			}
		}
		cmds := map[string]*redis.StringCmd{}
		_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for o := range sums {
				if !v.claimed[o] && missing[o] < 2 {
					cmds[o] = p.HGet(ctx, key, o)
				}
			}
			return nil
		})
		if len(cmds) == 0 {
			return
		}
		for o, c := range cmds {
			got, err := strconv.ParseUint(c.Val(), 10, 64)
			v.claimed[o] = err == nil && got == sums[o]
			if c.Err() == redis.Nil {
				missing[o]++
			}
		}
	}
}
