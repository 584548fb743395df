package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// With 3 live replicas each tick is won by its schedule's first claimer,
// the schedules spread over all three; when one dies without leaving, the
// others enqueue its share after the grace, well within tick_lock_ttl + 1s.
func TestFirstClaimerWinsAndOthersCoverItsDeath(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var scheds []config.Schedule
	for i := range 30 {
		scheds = append(scheds, sched(fmt.Sprintf("s%02d", i), "* * * * * *", config.CatchUpSkip))
	}
	c := testConfig(0, 2*time.Second, scheds...)
	rec := newRecorder()
	reps := map[string]*Scheduler{}
	for _, id := range []string{"r0", "r1", "r2"} {
		reps[id] = replica(t, srv, c, rec, id)
	}
	redistest.WaitFor(t, 5*time.Second, "every replica sees 3 live", func() bool {
		for _, r := range reps {
			if l := r.replicas.Load(); l == nil || len(*l) != 3 {
				return false
			}
		}
		return true
	})
	spec, _ := ParseSpec("* * * * * *", nil)
	from := spec.Next(time.Now())
	to := spec.Next(spec.Next(from))
	rec.waitTick(t, 5*time.Second, "s00", to, "r0", "r1", "r2")
	share := map[string]int{}
	var dead string
	for _, e := range rec.all() {
		if e.Result != ResultEnqueued || e.Tick.Before(from) || e.Tick.After(to) {
			continue
		}
		share[e.Replica]++
		if !reps[e.Replica].first(e.Schedule) {
			t.Errorf("%s tick %v won by %s, not its first claimer", e.Schedule, e.Tick, e.Replica)
		}
		if e.Lateness > claimGrace {
			t.Errorf("%s tick %v: lateness %v with its first claimer alive", e.Schedule, e.Tick, e.Lateness)
		}
	}
	if len(share) != 3 {
		t.Fatalf("ticks per replica %v: want all three to have a share", share)
	}

	// r0 dies as by SIGKILL: no leave, its heartbeat just stops.
	dead = "r0"
	reps[dead].crash()
	owned := map[string]bool{}
	for _, s := range scheds {
		if reps[dead].first(s.Name) {
			owned[s.Name] = true
		}
	}
	after := spec.Next(time.Now())
	rec.wait(t, 5*time.Second, "the dead replica's share enqueued by the others", func(evs []event) bool {
		got := 0
		for _, e := range evs {
			if e.Tick.Equal(after) && owned[e.Schedule] && (e.Result == ResultEnqueued) {
				got++
				if e.Replica == dead {
					t.Errorf("%s: enqueued by the dead replica", e.Schedule)
				}
				if e.Lateness > claimGrace+time.Second {
					t.Errorf("%s tick %v: taken over %v late, want within grace + 1s", e.Schedule, e.Tick, e.Lateness)
				}
			}
		}
		return got == len(owned)
	})
}
