package main

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A hold with StallAfter shows how long ago its holder last reported
// progress (progress_ms), as its renewals leave it: the time since the
// holder's own Progress call, not since the last renewal. A hold without
// StallAfter shows none.
func TestLocksShowTimeSinceLastProgress(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	ctx := context.Background()
	defer l.Close(ctx)
	hold := func(resource string, progressed chan<- time.Time, release <-chan struct{}, opts ...lockstep.LockOption) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- l.WithLock(ctx, resource, func(ctx context.Context, _ *lockstep.Lease) error {
				lockstep.Progress(ctx)
				progressed <- time.Now()
				<-release
				return nil
			}, append(opts, lockstep.TTL(600*time.Millisecond))...)
		}()
		return done
	}
	release := make(chan struct{})
	steadyAt, plainAt := make(chan time.Time, 1), make(chan time.Time, 1)
	steady := hold("steady", steadyAt, release, lockstep.StallAfter(time.Minute))
	plain := hold("plain", plainAt, release)
	defer func() {
		close(release)
		for _, done := range []<-chan error{steady, plain} {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	p := redistest.Receive(t, steadyAt, 10*time.Second, "steady's progress")
	redistest.Receive(t, plainAt, 10*time.Second, "plain held")

	// Renewals every 200 ms leave the same progress: it ages.
	var got float64
	var before, after time.Duration
	waitFor(t, 10*time.Second, "steady's progress a second old", func() bool {
		before = time.Since(p)
		v := lockOf(t, srv.Addr, "steady")
		after = time.Since(p)
		ms, ok := v["progress_ms"].(float64)
		got = ms
		return ok && ms >= 1000
	})
	// Both clocks are this host's; the server's millisecond and ours differ
	// by rounding only.
	if d := time.Duration(got) * time.Millisecond; d < before-5*time.Millisecond || d > after+5*time.Millisecond {
		t.Errorf("progress_ms %v, want the time since the holder's Progress, between %v and %v", d, before, after)
	}
	if v := lockOf(t, srv.Addr, "plain"); v == nil || v["progress_ms"] != nil {
		t.Errorf("a hold without StallAfter: %v, want progress_ms null", v)
	}
	if res := cli(t, srv.Addr, "", "locks"); res.code != 0 || !containsLine(res.stdout, "steady", "s ago") || containsLine(res.stdout, "plain", "ago") {
		t.Errorf("locks: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}
