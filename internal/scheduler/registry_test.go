package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

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
