package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// waitRun is one run of test:wait, from the stream test:waiter:runs.
type waitRun struct {
	id         string
	fence      int64
	start, end int64 // Unix ms; end 0 when the run never ended
}

func readWaitRuns(t *testing.T, c *redis.Client) []waitRun {
	t.Helper()
	msgs, err := c.XRange(context.Background(), "test:waiter:runs", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byRun := map[string]*waitRun{}
	var order []string
	for _, m := range msgs {
		id, _ := m.Values["task_id"].(string)
		fence, _ := strconv.ParseInt(m.Values["fence"].(string), 10, 64)
		at, _ := strconv.ParseInt(m.Values["at_ms"].(string), 10, 64)
		k := id + "/" + strconv.FormatInt(fence, 10)
		r := byRun[k]
		if r == nil {
			r = &waitRun{id: id, fence: fence}
			byRun[k] = r
			order = append(order, k)
		}
		if m.Values["event"] == "start" {
			r.start = at
		} else {
			r.end = at
		}
	}
	runs := make([]waitRun, 0, len(order))
	for _, k := range order {
		runs = append(runs, *byRun[k])
	}
	return runs
}

// waitsInWorker reports whether task id waits for its lock in a worker (the
// Wait policy marks its asynq hash while it does).
func waitsInWorker(c *redis.Client, id string) bool {
	return c.HGet(context.Background(), "asynq:{default}:t:"+id, "lockstep_waits").Val() == "1"
}

// logged returns the worker that logged msg for task id.
func logged(t *testing.T, workers []*proc, msg, id string) *proc {
	t.Helper()
	var w *proc
	waitFor(t, 10*time.Second, id+": "+msg, func() bool {
		for _, p := range workers {
			if p.findLog(func(m map[string]any) bool { return m["msg"] == msg && m["id"] == id }) != nil {
				w = p
				return true
			}
		}
		return false
	})
	return w
}

// The worker of a task that waits for its lock in the worker (Wait policy),
// first in line, is SIGKILLed. The holder's release hands the lock to that
// dead waiter; the grant expires within the lock's TTL and the next waiter,
// waiting in another worker, takes it then: the resource stalls no longer
// than the TTL. The dead waiter's task comes back when asynq recovers it and
// runs once. No two runs overlap, fences increase, and every task runs to
// its end exactly once.
func TestKilledFirstWaiterStallsNoLongerThanTheTTL(t *testing.T) {
	t.Parallel()
	bin := buildIgnorer(t)
	rs := redistest.Start(t)
	cfg := writeFile(t, "worker.yaml", strings.Replace(testYAML, "concurrency: 4", "concurrency: 1", 1))
	env := []string{"LOCKSTEP_REDIS_ADDR=" + rs.Addr}
	var workers []*proc
	for range 3 {
		workers = append(workers, startBinary(t, bin, env, "--config", cfg))
	}
	admin := rs.Client()
	enq := asynq.NewClientFromRedisClient(admin)
	insp := asynq.NewInspectorFromRedisClient(admin)
	defer enq.Close()
	defer insp.Close()
	enqueue := func(id string, workMS int) {
		t.Helper()
		p := `{"key":"k","work_ms":` + strconv.Itoa(workMS) + `}`
		if _, err := enq.Enqueue(asynq.NewTask("test:wait", []byte(p)), asynq.TaskID(id),
			asynq.MaxRetry(3), asynq.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}

	enqueue("holder", 2500)
	holder := logged(t, workers, "job started", "holder")
	enqueue("first", 300)
	victim := logged(t, workers, "lock busy; task waits in the worker", "first")
	waitFor(t, 10*time.Second, "first waiting in its worker", func() bool { return waitsInWorker(admin, "first") })
	enqueue("second", 300)
	waitFor(t, 10*time.Second, "second waiting in its worker", func() bool { return waitsInWorker(admin, "second") })
	if victim == holder {
		t.Fatal("the holder's worker took the waiter too: concurrency is not 1")
	}
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.wait(5 * time.Second)
	if runs := readWaitRuns(t, admin); len(runs) != 1 || runs[0].end != 0 {
		t.Fatalf("runs before the holder ended: %+v, want the holder's alone, still running", runs)
	}

	waitFor(t, 20*time.Second, "second to complete", func() bool {
		info, err := insp.GetTaskInfo("default", "second")
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	runs := readWaitRuns(t, admin)
	if len(runs) != 2 || runs[0].id != "holder" || runs[1].id != "second" {
		t.Fatalf("runs %+v, want holder then second", runs)
	}
	stall := time.Duration(runs[1].start-runs[0].end) * time.Millisecond
	// The grant to the dead waiter lasts one TTL; then the waiter's backoff
	// (contention_backoff_max 200ms) and a little.
	if stall > testTTL+time.Second {
		t.Errorf("second started %v after the holder ended, want within the TTL (%v) and its backoff", stall, testTTL)
	}
	t.Logf("first waiter's worker killed: the resource was idle %v between the holder and the next waiter (TTL %v)", stall, testTTL)

	// asynq recovers "first" (active on the dead worker) once its lease has
	// been expired 30s, from a recoverer that runs at a server's start and
	// then every minute: start a fresh worker once that is due.
	var orphaned time.Time
	waitFor(t, 45*time.Second, "first to be orphaned", func() bool {
		active, err := insp.ListActiveTasks("default")
		if err != nil {
			return false
		}
		for _, a := range active {
			if a.ID == "first" && a.IsOrphaned {
				orphaned = time.Now()
				return true
			}
		}
		return false
	})
	time.Sleep(time.Until(orphaned.Add(31 * time.Second))) // asynq's fixed cutoff
	startBinary(t, bin, env, "--config", cfg)
	waitFor(t, 60*time.Second, "first to complete", func() bool {
		info, err := insp.GetTaskInfo("default", "first")
		return err == nil && info.State == asynq.TaskStateCompleted
	})

	runs = readWaitRuns(t, admin)
	var ids []string
	for i, r := range runs {
		ids = append(ids, r.id)
		if r.end == 0 {
			t.Errorf("run %+v never ended", r)
		}
		if i > 0 && (r.start < runs[i-1].end || r.fence <= runs[i-1].fence) {
			t.Errorf("run %+v overlaps or does not follow %+v", r, runs[i-1])
		}
	}
	if want := []string{"holder", "second", "first"}; !slices.Equal(ids, want) {
		t.Errorf("ran %v, want %v, each once", ids, want)
	}
}
