package lock_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// fair.lua's turns: a tenant of weight 2 gets two starts for one of a
// tenant of weight 1 while both wait, each tenant's tasks start in the
// order seen, a tenant that had nothing waiting comes back at the virtual
// time (no credit), and the scope's keys expire on their own.
func TestFairTurnsFollowTheWeights(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lock.New(srv.Client())
	ctx := context.Background()
	scope := lock.FairScope("default", "t:fair")
	var seen []lock.FairTask
	for i := range 6 {
		seen = append(seen, lock.FairTask{ID: fmt.Sprintf("a%d", i), Tenant: "A", Weight: 2})
	}
	for i := range 3 {
		seen = append(seen, lock.FairTask{ID: fmt.Sprintf("b%d", i), Tenant: "B", Weight: 1})
	}
	f, err := l.Fair(ctx, scope, lock.FairAsk{Seen: seen, TTL: time.Minute})
	if err != nil || len(f.Park) != 9 || len(f.Started) != 0 {
		t.Fatalf("seeing 9 tasks: %+v, %v; want all 9 to wait", f, err)
	}
	f, err = l.Fair(ctx, scope, lock.FairAsk{Release: 6, TTL: time.Minute})
	if err != nil || len(f.Started) != 6 {
		t.Fatalf("release 6: %+v, %v", f, err)
	}
	var a, b []string
	for _, id := range f.Started {
		if id[0] == 'a' {
			a = append(a, id)
		} else {
			b = append(b, id)
		}
	}
	if !slices.Equal(a, []string{"a0", "a1", "a2", "a3"}) || !slices.Equal(b, []string{"b0", "b1"}) {
		t.Fatalf("the first 6 starts: %v; want A's first 4 and B's first 2, each in order", f.Started)
	}

	// Started tasks on their way to a worker hold further starts back, so
	// that they do not pile up: none starts until they are delivered.
	if f, err := l.Fair(ctx, scope, lock.FairAsk{Release: 3, TTL: time.Minute}); err != nil || len(f.Started) != 0 {
		t.Fatalf("release 3 with 6 started on their way: %+v, %v; want none started", f, err)
	}
	for _, id := range f.Started {
		if f, err := l.Fair(ctx, scope, lock.FairAsk{Self: id, TTL: time.Minute}); err != nil || !f.Run {
			t.Fatalf("%s delivered on its turn: %+v, %v; want it to run", id, f, err)
		}
	}

	// C, new with 3 tasks, comes in at the virtual time (a3's tag, 1.5):
	// it saved no credit while it had nothing waiting, so it gets its
	// share of the next starts (c0, then A's a4 and B's b2 at 2), not all.
	cs := []lock.FairTask{{ID: "c0", Tenant: "C", Weight: 1}, {ID: "c1", Tenant: "C", Weight: 1}, {ID: "c2", Tenant: "C", Weight: 1}}
	f, err = l.Fair(ctx, scope, lock.FairAsk{Seen: cs, Release: 3, TTL: time.Minute})
	if err != nil || !slices.Equal(f.Started, []string{"c0", "a4", "b2"}) {
		t.Fatalf("C comes in: %+v, %v; want c0, a4, b2 started next", f, err)
	}
	for _, k := range []string{":fair", ":fair:queue", ":fair:tasks", ":fair:started", ":fair:onway"} {
		key := "lockstep:{" + scope + "}" + k
		if ttl := srv.Client().PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
			t.Errorf("%s: TTL %v, want within a minute (it expires once idle)", key, ttl)
		}
	}
}

// A delivered task that is not first waits with its tag kept, and a waiting
// task's slot frees one more start; the task started for it runs on its
// next delivery without waiting again, and, its run ended, is not tagged
// again when seen once more while asynq records it. A task that cannot
// wait runs at once.
func TestFairDeliveries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lock.New(srv.Client())
	ctx := context.Background()
	scope := lock.FairScope("default", "t:fair")
	seen := []lock.FairTask{{ID: "a0", Tenant: "A", Weight: 1}, {ID: "a1", Tenant: "A", Weight: 1}, {ID: "b0", Tenant: "B", Weight: 1}}
	f, err := l.Fair(ctx, scope, lock.FairAsk{Self: "a0", Seen: seen, TTL: time.Minute})
	if err != nil || !f.Run || !slices.Equal(f.Park, []string{"a1", "b0"}) {
		t.Fatalf("a0 delivered first: %+v, %v; want it to run, a1 and b0 to wait", f, err)
	}
	// a1 delivered (its fallback came): b0's tag is smaller; a1 waits and
	// its slot starts b0.
	f, err = l.Fair(ctx, scope, lock.FairAsk{Self: "a1", Seen: seen[1:2], TTL: time.Minute})
	if err != nil || f.Run || !slices.Equal(f.Started, []string{"b0"}) {
		t.Fatalf("a1 delivered before its turn: %+v, %v; want it to wait and b0 started", f, err)
	}
	f, err = l.Fair(ctx, scope, lock.FairAsk{Self: "b0", Seen: seen[2:], TTL: time.Minute})
	if err != nil || !f.Run {
		t.Fatalf("b0 delivered on its turn: %+v, %v; want it to run", f, err)
	}
	if f, err = l.Fair(ctx, scope, lock.FairAsk{Done: "b0", Seen: seen[2:], TTL: time.Minute}); err != nil || len(f.Park) != 0 {
		t.Fatalf("b0 ended and seen again: %+v, %v; want it not tagged again", f, err)
	}
	f, err = l.Fair(ctx, scope, lock.FairAsk{Self: "x", Force: true, TTL: time.Minute})
	if err != nil || !f.Run {
		t.Fatalf("a task that cannot wait: %+v, %v; want it to run", f, err)
	}
	if f, err = l.Fair(ctx, scope, lock.FairAsk{Seen: []lock.FairTask{{ID: "x", Tenant: "X", Weight: 1}}, TTL: time.Minute}); err != nil || len(f.Park) != 0 {
		t.Fatalf("a forced task seen while it runs: %+v, %v; want it not tagged", f, err)
	}
}
