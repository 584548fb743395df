package scheduler

import (
	"fmt"
	"slices"
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
	scheds := numberedScheds(30, "s%02d", "* * * * * *")
	live, rec := threeLive(t, srv, testConfig(0, 2*time.Second, scheds...))
	reps := map[string]*Scheduler{}
	for _, r := range live {
		reps[r.id] = r
	}
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

// Followers learn that their first claimers claimed a second's ticks from
// one digest read per first claimer, not one check per tick.
func TestFollowersReadClaimDigests(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	scheds := numberedScheds(30, "d%02d", "* * * * * *")
	reps, rec := threeLive(t, srv, testConfig(0, 2*time.Second, scheds...))
	spec, _ := ParseSpec("* * * * * *", nil)
	from := spec.Next(time.Now().Add(time.Second))
	to := from.Add(3 * time.Second)
	checks0 := int64(0)
	for _, r := range reps {
		checks0 += r.followerChecks.Load()
	}
	followers := 0
	rec.wait(t, 10*time.Second, "2 followers of each tick", func(evs []event) bool {
		followers = 0
		for _, e := range evs {
			if e.Result == ResultFollower && !e.Tick.Before(from) && e.Tick.Before(to) {
				followers++
			}
		}
		return followers == 2*30*3
	})
	checks := -checks0
	for _, r := range reps {
		checks += r.followerChecks.Load()
	}
	t.Logf("%d follower ticks, %d checked one by one", followers, checks)
	// Each tick has 2 followers; a loaded machine may delay a first
	// claimer past the follower's reads now and then, not for most ticks.
	if checks > int64(followers)/2 {
		t.Errorf("%d follower ticks, %d checked one by one: want most settled by digests", followers, checks)
	}
	for _, s := range scheds {
		assertExactlyOnce(t, srv.Client(), s.Name, spec, from, to.Add(-time.Second))
	}
}

// A schedule in one replica's config only, whose first claimer by the live
// set is a replica that does not run it: the digest of that replica does not
// match, so the follower checks the tick, finds it unclaimed and enqueues it.
func TestFollowerClaimsWhatItsFirstClaimerDoesNotRun(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	probe, err := New(srv.Client(), testConfig(0, time.Second), WithReplicaID("a"))
	if err != nil {
		t.Fatal(err)
	}
	name := ""
	for i := 0; name == ""; i++ {
		if o, _ := probe.owner(fmt.Sprint("only-a-", i), &[]string{"a", "b"}); o == "b" {
			name = fmt.Sprint("only-a-", i)
		}
	}
	common := sched("common", "* * * * * *", config.CatchUpSkip)
	rec := newRecorder()
	a := replica(t, srv, testConfig(0, time.Second, common, sched(name, "* * * * * *", config.CatchUpSkip)), rec, "a")
	b := replica(t, srv, testConfig(0, time.Second, common), rec, "b")
	waitLive(t, a, b)
	spec, _ := ParseSpec("* * * * * *", nil)
	from := spec.Next(time.Now().Add(time.Second))
	to := from.Add(2 * time.Second)
	rec.waitTick(t, 10*time.Second, name, to, "a")
	assertExactlyOnce(t, srv.Client(), name, spec, from, to)
	for _, e := range rec.all() {
		if e.Schedule == name && !e.Tick.Before(from) && !e.Tick.After(to) && e.Result != ResultEnqueued {
			t.Errorf("%s tick %v: %s, want enqueued by a", name, e.Tick, e.Result)
		}
	}
}

// The registry of file schedules lists what live replicas declare: a
// schedule leaves it when the last replica whose config has it stops,
// dies (once its heartbeat expires) or was gone before a replica starts.
func TestFileRegistryForgetsUndeclaredSchedules(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	yearly := func(name string) config.Schedule { return sched(name, "0 0 1 1 *", config.CatchUpSkip) }
	st := NewStore(srv.Client(), "")
	registered := func() []string {
		all, err := st.List(t.Context(), nil)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		var names []string
		for _, in := range all {
			if in.Source == SourceFile {
				names = append(names, in.Schedule.Name)
			}
		}
		return names
	}
	waitRegistry := func(what string, want ...string) {
		t.Helper()
		redistest.WaitFor(t, 5*time.Second, what, func() bool { return slices.Equal(registered(), want) })
	}

	// A schedule that a replica declared before all of them were gone: no
	// live replica declares it, so the next one to start removes it.
	if err := srv.Client().HSet(t.Context(), st.k.file, "ghost", encodeDef(yearly("ghost"))).Err(); err != nil {
		t.Fatal(err)
	}
	a := replica(t, srv, testConfig(0, time.Second, yearly("a-only"), yearly("shared")), nil, "a")
	waitRegistry("a's schedules, and no ghost", "a-only", "shared")
	b := replica(t, srv, testConfig(0, time.Second, yearly("shared"), yearly("b-only")), nil, "b")
	replica(t, srv, testConfig(0, time.Second), nil, "c") // no file schedules
	waitRegistry("a's and b's schedules", "a-only", "b-only", "shared")

	stop(t, b) // a clean stop: b leaves, its own schedule with it
	waitRegistry("b-only gone with b", "a-only", "shared")

	a.crash() // no leave: c prunes once a's heartbeat expires
	waitRegistry("a's schedules gone after a's heartbeat expired")
}
