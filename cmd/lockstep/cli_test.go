package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A worker and a scheduler on a real Redis; a demo job holds lock:order:42
// while two more wait for it. Each view of the CLI shows it, and unlock
// breaks the lock so that the next holder gets a higher fence.
func TestCLIAgainstWorkerAndScheduler(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)

	// Nothing held yet: exit 1, and an empty array for scripts.
	var none []map[string]any
	cliJSON(t, srv.Addr, 1, &none, "locks", "--json")
	if none == nil || len(none) != 0 {
		t.Fatalf("locks --json with no lock = %v, want []", none)
	}
	if r := cli(t, srv.Addr, "", "waiters", "lock:order:42"); r.code != 1 {
		t.Fatalf("waiters of a free resource: exit %d, want 1 (%s)", r.code, r.stderr)
	}
	if r := cli(t, srv.Addr, "", "unlock", "lock:order:42", "--force", "--yes"); r.code != 1 {
		t.Fatalf("unlock of a free resource: exit %d, want 1 (%s)", r.code, r.stderr)
	}

	c := startCluster(t, srv)
	c.enqueueDemo(t, "hold-42", "42", 60_000)
	var held map[string]any
	waitFor(t, 20*time.Second, "the demo job holding lock:order:42 in lockstep locks", func() bool {
		held = lockOf(t, srv.Addr, "lock:order:42")
		return held != nil
	})
	host, _ := os.Hostname()
	fields := slices.Sorted(func(yield func(string) bool) {
		for k := range held {
			if !yield(k) {
				return
			}
		}
	})
	if want := []string{"backend", "fence", "held_ms", "holder", "limit", "permit", "progress_ms", "resource", "task_id", "ttl_ms", "type", "waiters"}; !reflect.DeepEqual(fields, want) {
		t.Fatalf("lock fields %v, want exactly %v", fields, want)
	}
	if held["task_id"] != "hold-42" || held["type"] != "demo:order.pay" || held["backend"] != "redis" || held["limit"] != float64(1) || held["permit"] != float64(0) ||
		!strings.HasPrefix(held["holder"].(string), host+":") || held["fence"].(float64) <= 0 ||
		held["ttl_ms"].(float64) <= 0 || held["ttl_ms"].(float64) > 2000 || held["held_ms"].(float64) < 0 {
		t.Fatalf("lock = %v", held)
	}

	// Two waiters, in the order they came.
	c.enqueueDemo(t, "wait-1", "42", 5)
	waitFor(t, 10*time.Second, "wait-1 among the waiters", func() bool { return len(waiters(t, srv.Addr)) == 1 })
	c.enqueueDemo(t, "wait-2", "42", 5)
	var ws []map[string]any
	waitFor(t, 10*time.Second, "wait-2 among the waiters", func() bool { ws = waiters(t, srv.Addr); return len(ws) == 2 })
	for i, id := range []string{"wait-1", "wait-2"} {
		w := ws[i]
		if w["task_id"] != id || w["position"].(float64) != float64(i+1) || w["queue"] != "default" ||
			w["type"] != "demo:order.pay" || w["waited_ms"].(float64) < 0 {
			t.Fatalf("waiter %d = %v, want %s", i+1, w, id)
		}
	}
	waitFor(t, 5*time.Second, "waiters: 2 in lockstep locks", func() bool {
		held = lockOf(t, srv.Addr, "lock:order:42")
		return held != nil && held["waiters"] == float64(2)
	})

	// Terminal views: aligned columns.
	r := cli(t, srv.Addr, "", "locks")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) < 2 || !strings.HasPrefix(lines[0], "RESOURCE") {
		t.Fatalf("locks: exit %d\n%s", r.code, r.stdout)
	}
	col := strings.Index(lines[0], "HOLDER")
	i := slices.IndexFunc(lines[1:], func(l string) bool { return strings.HasPrefix(l, "lock:order:42 ") })
	if i < 0 || col < 0 || !strings.HasPrefix(lines[1+i][col:], held["holder"].(string)) {
		t.Fatalf("locks: no row of lock:order:42 with its holder under HOLDER:\n%s", r.stdout)
	}
	if r := cli(t, srv.Addr, "", "waiters", "lock:order:42"); r.code != 0 || !strings.Contains(r.stdout, "wait-1") {
		t.Fatalf("waiters: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	t.Run("schedules", func(t *testing.T) {
		r := cli(t, srv.Addr, "", "schedules", "--json")
		var scheds []map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &scheds) != nil {
			t.Fatalf("schedules --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		if len(scheds) != 1 || scheds[0]["name"] != "every-second" || scheds[0]["source"] != "file" {
			t.Fatalf("schedules = %v, want every-second from the file", scheds)
		}
	})
	t.Run("ticks", func(t *testing.T) {
		var ticks []map[string]any
		redistest.WaitEvery(t, 10*time.Second, 100*time.Millisecond, "a done tick of every-second", func() bool {
			r := cli(t, srv.Addr, "", "ticks", "every-second", "--last", "5", "--json")
			return r.code == 0 && json.Unmarshal([]byte(r.stdout), &ticks) == nil &&
				slices.ContainsFunc(ticks, func(tk map[string]any) bool { return tk["state"] == "done" })
		})
		for _, tk := range ticks {
			s, _ := tk["tick"].(string)
			tick, err := time.Parse(time.RFC3339, s)
			if err != nil || !slices.Contains([]any{"done", "pending", "skipped", "missed"}, tk["state"]) {
				t.Fatalf("ticks --json: %v, want a tick (RFC 3339) and a state done/pending/skipped/missed", tk)
			}
			if tk["state"] == "done" && tk["task_id"] != fmt.Sprintf("every-second:%d", tick.Unix()) {
				t.Fatalf("ticks --json: done tick %v has task_id %v, want every-second:<tick>", tk, tk["task_id"])
			}
		}
	})

	// Unlock: refused without --force, and off a terminal without --yes.
	if r := cli(t, srv.Addr, "", "unlock", "lock:order:42"); r.code != 2 || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("unlock without --force: exit %d, %s", r.code, r.stderr)
	}
	if r := cli(t, srv.Addr, "y\n", "unlock", "lock:order:42", "--force"); r.code != 2 || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("unlock off a terminal without --yes: exit %d, %s", r.code, r.stderr)
	}
	if lockOf(t, srv.Addr, "lock:order:42") == nil {
		t.Fatal("a refused unlock deleted the lock")
	}
	fence := held["fence"].(float64)
	r = cli(t, srv.Addr, "", "unlock", "lock:order:42", "--force", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "unlocked lock:order:42") || !strings.Contains(r.stdout, "task hold-42") {
		t.Fatalf("unlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var next map[string]any
	waitFor(t, 15*time.Second, "a next holder of lock:order:42 with a higher fence", func() bool {
		next = lockOf(t, srv.Addr, "lock:order:42")
		return next != nil && next["fence"].(float64) > fence
	})
	t.Logf("after unlock: %v held it with fence %.0f > %.0f", next["task_id"], next["fence"], fence)
}

func waiters(t *testing.T, addr string) []map[string]any {
	t.Helper()
	r := cli(t, addr, "", "waiters", "lock:order:42", "--json")
	var ws []map[string]any
	if r.code > 1 || json.Unmarshal([]byte(r.stdout), &ws) != nil {
		t.Fatalf("waiters --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	return ws
}

// A lock taken with lockstep.WithLock shows in `lockstep locks`, and a second
// WithLock waiting for it (in arrival order, woken by the release) counts
// among its waiters and is listed by `lockstep waiters`.
func TestLocksCountsWithLockWaiters(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	defer l.Close(context.Background())
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 2)
	go func() {
		done <- l.WithLock(context.Background(), "report:daily", func(context.Context, *lockstep.Lease) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	go func() {
		done <- l.WithLock(context.Background(), "report:daily", func(context.Context, *lockstep.Lease) error { return nil },
			lockstep.Wait(20*time.Second))
	}()
	waitFor(t, 10*time.Second, "one waiter on report:daily in lockstep locks", func() bool {
		v := lockOf(t, srv.Addr, "report:daily")
		return v != nil && v["waiters"] == float64(1)
	})
	// `waiters` lists it as a caller of the resource's one queue, naming its process.
	r := cli(t, srv.Addr, "", "waiters", "report:daily", "--json")
	var ws []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ws) != nil {
		t.Fatalf("waiters --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if host, _ := os.Hostname(); len(ws) != 1 || ws[0]["kind"] != "call" || ws[0]["state"] != "waiting" ||
		!strings.HasPrefix(ws[0]["holder"].(string), host+":") {
		t.Errorf("waiters of report:daily = %v, want one call waiting from this process", ws)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// Every subcommand answers --help with exit 0, even without a configuration;
// bad usage and bad configuration exit 2 with a message naming the problem.
func TestUsageAndConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		if c.name == "schedules" || c.name == "ticks" {
			continue // written elsewhere; their own tests cover them
		}
		r := cli(t, "", "", c.name, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "usage: lockstep "+c.name) {
			t.Errorf("%s --help: exit %d\n%s%s", c.name, r.code, r.stdout, r.stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: lockstep"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"locks"}, "redis.addr: required"},
		{[]string{"--config", "/nonexistent.yaml", "locks"}, "/nonexistent.yaml"},
	} {
		r := cli(t, "", "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("lockstep %v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	short := []string{"LOCKSTEP_REDIS_ADDR=127.0.0.1:1", "LOCKSTEP_LOCK_BACKEND=etcd", "LOCKSTEP_LOCK_ETCD_ENDPOINTS=127.0.0.1:1",
		"LOCKSTEP_LOCK_TTL=2s"}
	if r := cliEnv(t, short, "", "locks"); r.code != 2 || !strings.Contains(r.stderr, "env LOCKSTEP_LOCK_TTL: must be at least 3s with lock.backend etcd") {
		t.Errorf("lock.ttl 2s with etcd: exit %d, stderr %q; want 2 naming lock.ttl and its bound", r.code, r.stderr)
	}
	srv := redistest.Start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"locks", "extra"}, `unexpected argument "extra"`},
		{[]string{"locks", "--bogus"}, "-bogus"},
		{[]string{"waiters"}, "want one RESOURCE"},
		{[]string{"waiters", "a", "b"}, "want one RESOURCE"},
		{[]string{"unlock"}, "want one RESOURCE"},
		{[]string{"--prefix", "a{b", "locks"}, "--prefix"},
		{[]string{"ui", "--http-addr", "nonsense"}, "--http-addr"},
		{[]string{"ui", "--asynqmon", "localhost:8080"}, "--asynqmon"},
	} {
		if r := cli(t, srv.Addr, "", tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("lockstep %v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
