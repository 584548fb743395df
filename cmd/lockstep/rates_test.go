package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A rate key's state in `lockstep rates` and on the page: the burst it has
// left and, once none is left, when it allows the next one, the moment its
// own Allow named; a held lock of the same name is apart, in `lockstep
// locks`, whose output stays the locks alone.
func TestRatesShowRateKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	defer l.Close(context.Background())
	ctx := context.Background()
	r := lockstep.RateLimit{N: 1, Per: time.Hour, Burst: 3} // an hour apart: no turn comes back meanwhile
	if w, err := l.Allow(ctx, "tenant:7", r); err != nil || w != 0 {
		t.Fatalf("Allow: wait %v, err %v", w, err)
	}
	rateOf := func(key string) map[string]any {
		t.Helper()
		var all []map[string]any
		cliJSON(t, srv.Addr, 0, &all, "rates", "--json")
		var found map[string]any
		for _, v := range all {
			if v["key"] == key {
				found = v
			} else {
				t.Fatalf("rates --json: unexpected object %v", v)
			}
		}
		return found
	}
	v := rateOf("tenant:7")
	if v == nil || v["interval_us"] != float64(time.Hour.Microseconds()) || v["burst"] != float64(3) || v["burst_left"] != float64(2) ||
		v["wait_ms"] != float64(0) || v["backend"] != "redis" {
		t.Fatalf("tenant:7 after one admission of a burst of 3: %v; want 2 left, allowed now", v)
	}
	if res := cli(t, srv.Addr, "", "rates"); res.code != 0 || !strings.Contains(res.stdout, "RATE KEY") ||
		!containsLine(res.stdout, "tenant:7", "1h0m0s", "2/3", "now") {
		t.Fatalf("rates: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if res := cli(t, srv.Addr, "", "locks"); res.code != 1 || strings.Contains(res.stdout, "tenant:7") {
		t.Fatalf("locks with no lock held and a live rate key: exit %d, want 1 and no rate key\n%s%s", res.code, res.stdout, res.stderr)
	}

	// The burst used up: the next admission is the one Allow's wait names.
	for range 2 {
		if _, err := l.Allow(ctx, "tenant:7", r); err != nil {
			t.Fatal(err)
		}
	}
	before := time.Now()
	wait, err := l.Allow(ctx, "tenant:7", r)
	if err != nil || wait <= 0 {
		t.Fatalf("Allow past the burst: wait %v, err %v", wait, err)
	}
	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() { // a lock of the same name is its own line
		done <- l.WithLock(ctx, "tenant:7", func(context.Context, *lockstep.Lease) error {
			close(held)
			<-release
			return nil
		})
	}()
	defer func() {
		close(release)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	redistest.Receive(t, held, 10*time.Second, "the lock tenant:7 held")
	v = rateOf("tenant:7")
	waitMs, _ := v["wait_ms"].(float64)
	elapsed := time.Since(before)
	if v["burst_left"] != float64(0) || waitMs > float64(wait.Milliseconds()+1) || waitMs < float64((wait-elapsed).Milliseconds()) {
		t.Fatalf("tenant:7 with its burst used up: %v; want 0 left, wait_ms within [%v, %v]", v, wait-elapsed, wait)
	}
	if lk := lockOf(t, srv.Addr, "tenant:7"); lk == nil || lk["resource"] != "tenant:7" {
		t.Fatalf("the lock tenant:7 beside its rate key: %v", lk)
	}
	if res := cli(t, srv.Addr, "", "rates"); res.code != 0 || !containsLine(res.stdout, "tenant:7", "0/3", "in ") {
		t.Fatalf("rates: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	// The page's API: /api/locks prints what locks --json does, /api/rates
	// what rates --json does, /api/overview has both.
	base := startUI(t, srv.Addr)
	var o struct {
		Locks []lockView `json:"locks"`
		Rates []rateView `json:"rates"`
	}
	getJSON(t, base+"/api/overview", 200, &o)
	if len(o.Rates) != 1 || o.Rates[0].Key != "tenant:7" || o.Rates[0].BurstLeft != 0 || o.Rates[0].WaitMs <= 0 || len(o.Locks) != 1 {
		t.Fatalf("/api/overview: locks %+v, rates %+v", o.Locks, o.Rates)
	}
	var locks, rates []map[string]any
	getJSON(t, base+"/api/locks", 200, &locks)
	getJSON(t, base+"/api/rates", 200, &rates)
	if len(locks) != 1 || locks[0]["resource"] != "tenant:7" || len(rates) != 1 || rates[0]["key"] != "tenant:7" {
		t.Fatalf("/api/locks: %v, /api/rates: %v; want the lock, and the rate key", locks, rates)
	}
}

// containsLine reports whether one line of s holds every one of subs.
func containsLine(s string, subs ...string) bool {
	for line := range strings.Lines(s) {
		if containsAll(line, subs...) {
			return true
		}
	}
	return false
}
