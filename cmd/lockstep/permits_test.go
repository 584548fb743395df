package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A resource with a limit shows its limit and one object per held permit,
// permit 0 free included; unlock --permit K breaks that permit alone (its
// holder is cancelled), and a permit out of range exits 2.
func TestLocksAndUnlockOfPermits(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	defer l.Close(context.Background())
	type ended struct {
		permit int
		err    error
	}
	done := make(chan ended, 3)
	type holder struct {
		permit  int
		release chan struct{}
	}
	entered := make(chan holder, 3)
	for range 3 {
		go func() {
			var permit int
			release := make(chan struct{})
			err := l.WithLock(context.Background(), "lock:tenant:7", func(ctx context.Context, lease *lockstep.Lease) error {
				permit = lease.Permit()
				entered <- holder{permit, release}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, lockstep.Permits(3))
			done <- ended{permit, err}
		}()
	}
	releases := map[int]chan struct{}{}
	for range 3 {
		h := <-entered
		releases[h.permit] = h.release
	}
	var locks []lockView
	cliJSON(t, srv.Addr, 0, &locks, "locks", "--json")
	seen := map[int]bool{}
	for _, v := range locks {
		if v.Resource != "lock:tenant:7" || v.Limit != 3 || v.Fence <= 0 || v.TTLMs <= 0 || v.HeldMs == nil || v.Holder == "" {
			t.Fatalf("locks --json: %+v", v)
		}
		seen[v.Permit] = true
	}
	if len(locks) != 3 || len(seen) != 3 {
		t.Fatalf("locks --json = %+v, want permits 0, 1 and 2", locks)
	}
	if r := cli(t, srv.Addr, "", "locks"); r.code != 0 || !strings.Contains(r.stdout, "lock:tenant:7[2/3]") {
		t.Fatalf("locks: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, bad := range []string{"3", "-1"} {
		if r := cli(t, srv.Addr, "", "unlock", "lock:tenant:7", "--permit", bad, "--force", "--yes"); r.code != 2 || !strings.Contains(r.stderr, "out of range") {
			t.Errorf("unlock --permit %s: exit %d, stderr %q; want 2, out of range", bad, r.code, r.stderr)
		}
	}
	r := cli(t, srv.Addr, "", "unlock", "lock:tenant:7", "--permit", "1", "--force", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "permit 1 of lock:tenant:7") {
		t.Fatalf("unlock --permit 1: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	select {
	case e := <-done:
		if e.permit != 1 || !errors.Is(e.err, lockstep.ErrLockLost) {
			t.Fatalf("permit %d's holder ended with %v, want permit 1's, lost", e.permit, e.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("permit 1's holder not cancelled by the unlock")
	}
	// Permit 0 free, 2 held: the resource is still listed, by its permit 2.
	close(releases[0])
	if e := <-done; e.err != nil || e.permit != 0 {
		t.Fatalf("permit 0's holder: %+v", e)
	}
	cliJSON(t, srv.Addr, 0, &locks, "locks", "--json")
	if len(locks) != 1 || locks[0].Permit != 2 || locks[0].Limit != 3 {
		t.Fatalf("with permit 2 held alone: %+v", locks)
	}
	close(releases[2])
	<-done
	cliJSON(t, srv.Addr, 1, &locks, "locks", "--json")
}
