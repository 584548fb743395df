package scheduler

import (
	"context"
	"hash/fnv"
	"slices"
	"time"
)

const (
	// claimGrace is how long a replica that is not a tick's first claimer
	// waits before it claims the tick itself: by then the first claimer has
	// claimed it (the claim answers "done" or "held" at once), or it is dead
	// or slow and this replica takes the tick.
	claimGrace = 200 * time.Millisecond
	// replicaExpiry is how long a replica without a heartbeat counts as live.
	replicaExpiry = 2 * time.Second
)

// heartbeat records this replica as live (or gone, join false) and returns
// the live replicas; isNew reports that it was not live before (its file
// schedules' declaration went with it: it registers them again). The file
// schedules of replicas found gone leave the registry unless a live
// replica declares them too.
func (st *Store) heartbeat(ctx context.Context, id string, join bool) (live []string, isNew bool, err error) {
	res, err := runSlice(ctx, st.client, scriptReplicas, []string{st.k.replicas, st.k.file, st.k.declared + id},
		id, replicaExpiry.Milliseconds(), b01(join), st.k.declared)
	if err != nil {
		return nil, false, err
	}
	if len(res) > 0 {
		isNew = res[0] == int64(1)
		res = res[1:]
	}
	live = make([]string, 0, len(res))
	for _, v := range res {
		if id, ok := v.(string); ok {
			live = append(live, id)
		}
	}
	return live, isNew, nil
}

// first reports whether this replica is the first to claim the ticks of
// schedule: the live replica with the highest rendezvous hash of (replica,
// schedule). Replicas agree as long as they see the same live set; when they
// do not, a tick has two first claimers (one wins the claim) or none (the
// others claim it after claimGrace). With no view of the live set yet (or
// one without itself), a replica claims every tick at once.
func (s *Scheduler) first(schedule string) bool {
	o, ok := s.owner(schedule, s.replicas.Load())
	return !ok || o == s.id
}

// owner returns schedule's first claimer among live; false with no view of
// the live set, or one without this replica.
func (s *Scheduler) owner(schedule string, live *[]string) (string, bool) {
	if live == nil || !slices.Contains(*live, s.id) {
		return "", false
	}
	var best string
	var bestH uint64
	for _, id := range *live {
		h := fnv.New64a()
		_, _ = h.Write([]byte(id))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(schedule))
		if v := mix(h.Sum64()); best == "" || v > bestH {
			best, bestH = id, v
		}
	}
	return best, true
}

// mix is splitmix64's finalizer: FNV alone orders ids that differ in one
// byte the same way for every schedule.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
