package lock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A dead holder's task that a recoverer brings back goes first in its
// resource's queue (Front), ahead of the tasks that waited behind the lock
// it held; the next release hands the lock to it. If it had run already
// (its done marker), its take hands the grant on to the next waiter at
// once, on a lock and on a permit, instead of keeping the resource for a
// TTL.
func TestFrontServesARecoveredTaskFirst(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		l, c, _ := newLocker(t)
		ctx := context.Background()
		r := "front"
		take := func(id string) lock.Taken {
			t.Helper()
			tk, err := l.Take(ctx, r, "default", id, time.Minute, time.Minute, true, "", limit, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tk
		}
		var held []*lock.Lease
		for i := range limit {
			h := take("holder" + string(rune('a'+i)))
			if h.Lease == nil {
				t.Fatalf("limit %d: holder %d got no permit: %+v", limit, i, h)
			}
			held = append(held, h.Lease)
		}
		for _, id := range []string{"w1", "w2"} {
			if tk := take(id); tk.Lease != nil {
				t.Fatalf("limit %d: %s took a held resource", limit, id)
			}
		}
		ahead, err := l.Front(ctx, r, "default", "dead", time.Minute)
		if err != nil || ahead != 2 {
			t.Fatalf("limit %d: Front went ahead of %d waiters (%v), want 2", limit, ahead, err)
		}
		ws, err := l.Waiters(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, w := range ws {
			order = append(order, w.TaskID)
		}
		if want := []string{"dead", "w1", "w2"}; !slices.Equal(order, want) {
			t.Fatalf("limit %d: queue %v, want %v", limit, order, want)
		}

		// The first release grants it; it had run already: its take hands on.
		if err := held[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, l.DoneKey(r, "default", "dead"), "ok", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if tk := take("dead"); !tk.Done || tk.Lease != nil {
			t.Fatalf("limit %d: the recovered task that ran already: %+v, want Done", limit, tk)
		}
		w1 := take("w1")
		if w1.Lease == nil || !w1.Granted {
			t.Fatalf("limit %d: the next waiter after a done grant: %+v, want the lock granted to it", limit, w1)
		}
		if n := c.ZCard(ctx, l.QueueKey(r)).Val(); n != 1 {
			t.Fatalf("limit %d: %d left in the queue, want w2 alone", limit, n)
		}
	}
}

// Unfront takes a Front back: the task leaves the queue.
func TestUnfrontLeavesTheQueue(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := context.Background()
	if _, err := l.Front(ctx, "unfront", "default", "gone", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Unfront(ctx, "unfront", "default", "gone"); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, l.QueueKey("unfront")).Val(); n != 0 {
		t.Fatal("the queue is still there")
	}
}
