package lock_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A registry's records, beats and markers as recovery uses them: Remove
// takes out the records and markers it is given; a dead process's record is claimed by exactly one
// of several recoverers; a process that beat again is not forgotten.
func TestRegistryRecordsBeatsAndClaims(t *testing.T) {
	t.Parallel()
	l, admin, _ := newLocker(t)
	ctx := context.Background()
	dead, judge := l.Registry(admin, "host:1"), l.Registry(admin, "host:2")
	recA, recB := lock.HoldRecord("orders:1", "default", "a"), lock.HoldRecord("", "default", "b")
	for _, rec := range []string{recA, recB} {
		if err := dead.Record(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := dead.MarkDone(ctx, "orders:1", "default", "a", "ok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := judge.Outcome(ctx, "orders:1", "default", "a"); err != nil || got != "ok" {
		t.Fatalf("outcome %q %v, want ok", got, err)
	}
	if got, err := judge.Outcome(ctx, "orders:1", "default", "none"); err != nil || got != "" {
		t.Fatalf("outcome of a task without a marker %q %v, want none", got, err)
	}
	now := time.Now()
	if err := dead.Beat(ctx, now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := dead.Remove(ctx, []string{recB}, []string{l.DoneKey("orders:1", "default", "a")}); err != nil {
		t.Fatal(err)
	}
	if err := judge.Beat(ctx, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if recs, _ := judge.Records(ctx, "host:1"); !slices.Equal(recs, []string{recA}) {
		t.Fatalf("after the beat host:1 has records %q, want only %q", recs, recA)
	}
	if got, _ := judge.Outcome(ctx, "orders:1", "default", "a"); got != "" {
		t.Fatalf("the beat left the marker dropped with it (%q)", got)
	}
	if over, _ := judge.Overdue(ctx, now, 16); !slices.Equal(over, []string{"host:1"}) {
		t.Fatalf("overdue %q, want host:1 alone", over)
	}
	if live, _ := judge.Live(ctx, now); !slices.Equal(live, []string{"host:2"}) {
		t.Fatalf("live %q, want host:2 alone", live)
	}
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if won, err := judge.Claim(ctx, "host:1", recA); err == nil && won {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d recoverers claimed the record, want exactly 1", wins.Load())
	}
	// host:1 beats again before it is forgotten: it stays.
	if err := dead.Beat(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := judge.Forget(ctx, "host:1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if live, _ := judge.Live(ctx, time.Now()); !slices.Contains(live, "host:1") {
		t.Fatalf("a process that beat again was forgotten (live %q)", live)
	}
	if err := dead.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if live, _ := judge.Live(ctx, time.Now()); slices.Contains(live, "host:1") {
		t.Fatalf("a process that left is still live (%q)", live)
	}
}
