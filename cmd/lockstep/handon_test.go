package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// handOnBound is how soon after `lockstep unlock --force` exits a waiting
// WithLock caller must be running its function: the hand-off is in the
// unlock's own step, the caller is woken by it (its own retry is seconds
// away).
const handOnBound = 50 * time.Millisecond

// `lockstep unlock --force` hands the resource on: a WithLock caller that
// waits holds it at once, with a fence above the broken holder's, whose
// function is cancelled with ErrLockLost; a job parked behind a broken
// holder is granted the lock by the unlock itself and starts as it would
// after an ordinary release.
func TestUnlockForceHandsOnToTheFirstWaiter(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lockstep.NewLocker(srv.Client())
	defer l.Close(context.Background())

	// hold takes resource with WithLock until released (nil: until its
	// context ends) and reports its fence, then its function's error cause.
	hold := func(resource string, release <-chan struct{}) (fence <-chan int64, done <-chan error) {
		f, d := make(chan int64, 1), make(chan error, 1)
		go func() {
			d <- l.WithLock(context.Background(), resource, func(ctx context.Context, lease *lockstep.Lease) error {
				f <- lease.Fence()
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-release:
					return nil
				}
			}, lockstep.Wait(10*time.Second)) // the task before may still be releasing it
		}()
		return f, d
	}
	// fenceOf is the fence of a hold, or the test's end if it got none.
	fenceOf := func(t *testing.T, fence <-chan int64, done <-chan error) int64 {
		t.Helper()
		select {
		case f := <-fence:
			return f
		case err := <-done:
			t.Fatalf("the holder did not get the lock: %v", err)
		}
		return 0
	}

	t.Run("WithLock", func(t *testing.T) {
		fence, done := hold("report:forced", nil)
		broken := fenceOf(t, fence, done)
		type got struct {
			at    time.Time
			fence int64
		}
		next := make(chan got, 1)
		go func() {
			err := l.WithLock(context.Background(), "report:forced", func(_ context.Context, lease *lockstep.Lease) error {
				next <- got{time.Now(), lease.Fence()}
				return nil
			}, lockstep.Wait(20*time.Second))
			if err != nil {
				t.Error(err)
			}
		}()
		waitFor(t, 10*time.Second, "the caller waiting for report:forced", func() bool {
			v := lockOf(t, srv.Addr, "report:forced")
			return v != nil && v["waiters"] == float64(1)
		})
		sent := time.Now()
		if r := cli(t, srv.Addr, "", "unlock", "report:forced", "--force", "--yes"); r.code != 0 {
			t.Fatalf("unlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		exited := time.Now()
		var g got
		select {
		case g = <-next:
		case <-time.After(5 * time.Second):
			t.Fatal("the waiting caller was not handed report:forced")
		}
		t.Logf("the waiting caller ran %v after unlock was started, %v after it exited", g.at.Sub(sent), g.at.Sub(exited))
		if g.at.After(exited.Add(handOnBound)) {
			t.Errorf("the waiting caller ran %v after unlock exited, want within %v", g.at.Sub(exited), handOnBound)
		}
		if g.fence <= broken {
			t.Errorf("the caller's fence %d is not above the broken holder's %d", g.fence, broken)
		}
		if err := <-done; !errors.Is(err, lockstep.ErrLockLost) {
			t.Errorf("the broken holder's function ended with %v, want ErrLockLost", err)
		}
	})

	t.Run("parked job", func(t *testing.T) {
		startProc(t, "worker", []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr}, "--config", proctest.WriteFile(t, "worker.yaml", workerYAML))
		c := &cluster{addr: srv.Addr, enq: asynq.NewClientFromRedisClient(srv.Client())}
		resource := demo.Resource("forced")
		// park holds resource, enqueues task id (of workMS) for it and waits
		// until the task is parked in its queue; it returns the holder.
		park := func(id string, workMS int, release <-chan struct{}) (int64, <-chan error) {
			fence, done := hold(resource, release)
			f := fenceOf(t, fence, done)
			c.enqueueDemo(t, id, "forced", workMS)
			waitFor(t, 10*time.Second, id+" parked behind the holder", func() bool {
				ws := waitersOf(t, srv.Addr, resource)
				return len(ws) == 1 && ws[0]["task_id"] == id
			})
			return f, done
		}
		startedAfter := func(id string, from time.Time) time.Duration {
			var x demo.Execution
			waitFor(t, 10*time.Second, id+" run", func() bool {
				xs, err := demo.ReadExecutions(context.Background(), srv.Client(), lock.DefaultPrefix)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range xs {
					if e.TaskID == id && e.Outcome == "ok" {
						x = e
						return true
					}
				}
				return false
			})
			return time.UnixMilli(x.StartedMS).Sub(from)
		}

		// An ordinary release, the bound.
		release := make(chan struct{})
		_, done := park("released", 5, release)
		released := time.Now()
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		ordinary := startedAfter("released", released)

		broken, done := park("forced", 2000, nil) // still running when the check below looks
		if r := cli(t, srv.Addr, "", "unlock", resource, "--force", "--yes"); r.code != 0 {
			t.Fatalf("unlock: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		exited := time.Now()
		// Granted in the unlock's own step: no one else can take it now.
		if v := lockOf(t, srv.Addr, resource); v == nil || v["task_id"] != "forced" || v["fence"].(float64) <= float64(broken) {
			t.Fatalf("right after unlock, %s = %v; want it held for the parked task forced with a fence above %d", resource, v, broken)
		}
		if err := <-done; !errors.Is(err, lockstep.ErrLockLost) {
			t.Errorf("the broken holder's function ended with %v, want ErrLockLost", err)
		}
		forced := startedAfter("forced", exited)
		t.Logf("parked job started %v after an ordinary release, %v after unlock --force exited", ordinary, forced)
		if bound := 2*ordinary + 100*time.Millisecond; forced > bound {
			t.Errorf("the parked job started %v after unlock --force, want within an ordinary hand-off's bound %v", forced, bound)
		}
	})
}

// waitersOf is `lockstep waiters resource --json`.
func waitersOf(t *testing.T, addr, resource string) []map[string]any {
	t.Helper()
	var ws []map[string]any
	r := cli(t, addr, "", "waiters", resource, "--json")
	if r.code > 1 {
		t.Fatalf("waiters: exit %d\n%s", r.code, r.stderr)
	}
	if r.code == 0 {
		if err := json.Unmarshal([]byte(r.stdout), &ws); err != nil {
			t.Fatalf("waiters --json: %v\n%s", err, r.stdout)
		}
	}
	return ws
}

// While a hot order's waiters are handed the lock one after another (a
// chain on one worker: each release runs the next task under a token the
// release writes), `lockstep locks` names the task that holds it: every
// (fence, task) it showed is one that ran with that fence, of its type.
func TestLocksNameTheTaskRunningAfterHandOffs(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	startProc(t, "worker", []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr}, "--config", proctest.WriteFile(t, "worker.yaml", workerYAML))
	c := &cluster{addr: srv.Addr, enq: asynq.NewClientFromRedisClient(srv.Client())}
	resource := demo.Resource("chain")
	// Each hold lasts a few of the loop's looks below (a lockstep locks and
	// a read of the executions), as long as one takes on this machine now.
	look := time.Now()
	lockOf(t, srv.Addr, resource)
	_, _ = demo.ReadExecutions(context.Background(), srv.Client(), lock.DefaultPrefix)
	work := max(500*time.Millisecond, 4*time.Since(look))
	c.enqueueDemo(t, "head", "chain", int(work.Milliseconds())+2000) // and while the others park
	waitFor(t, 10*time.Second, "head holding "+resource, func() bool { return lockOf(t, srv.Addr, resource) != nil })
	ids := []string{"next 1", "next|2", "next/3", "next%4", "next:5"} // ids a token must escape
	for _, id := range ids {
		c.enqueueDemo(t, id, "chain", int(work.Milliseconds()))
		waitFor(t, 10*time.Second, id+" parked", func() bool {
			for _, w := range waitersOf(t, srv.Addr, resource) {
				if w["task_id"] == id {
					return true
				}
			}
			return false
		})
	}
	seen := map[int64]map[string]any{} // by fence
	all := append([]string{"head"}, ids...)
	waitFor(t, 20*time.Second+time.Duration(len(all))*work, "the chain to run", func() bool {
		if v := lockOf(t, srv.Addr, resource); v != nil {
			seen[int64(v["fence"].(float64))] = v
		}
		xs, err := demo.ReadExecutions(context.Background(), srv.Client(), lock.DefaultPrefix)
		if err != nil {
			t.Fatal(err)
		}
		return len(xs) == len(all)
	})
	xs, _ := demo.ReadExecutions(context.Background(), srv.Client(), lock.DefaultPrefix)
	ran := map[int64]string{}
	for _, x := range xs {
		ran[x.Fence] = x.TaskID
	}
	for fence, v := range seen {
		if v["task_id"] != ran[fence] || v["type"] != demo.Type {
			t.Errorf("lockstep locks showed fence %d held by task %q (%v), which ran %q (%s)", fence, v["task_id"], v["type"], ran[fence], demo.Type)
		}
	}
	if len(seen) < 4 {
		t.Errorf("lockstep locks saw %d of the %d holds: too few to tell", len(seen), len(all))
	}
	t.Logf("lockstep locks saw %d of %d holds", len(seen), len(all))
}
