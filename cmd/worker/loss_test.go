package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// defaultTTLYAML keeps the default 30s lock TTL: the next renewal is 10s
// away, so a loss seen within a second was seen through a server notice.
const defaultTTLYAML = `
http:
  addr: "127.0.0.1:0"
log:
  format: json
  level: debug
worker:
  concurrency: 4
  shutdown_timeout: 2s
  contention_backoff_min: 10ms
  contention_backoff_max: 200ms
`

// A lock deleted or overwritten mid-job, at a random offset, with the
// default 30s TTL: the run ends lock_lost within 1s of the change, and the
// task then ends ok exactly once.
func TestLostLockNoticedWithinASecond(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), defaultTTLYAML)
	w := r.worker()
	admin := r.admin
	bg := context.Background()

	for i, change := range []struct {
		name string
		do   func(key string) error
	}{
		{"deleted", func(key string) error { return admin.Del(bg, key).Err() }},
		{"overwritten", func(key string) error { return admin.Set(bg, key, "operator", 1500*time.Millisecond).Err() }},
	} {
		id, order := "loss-"+change.name, "loss-"+change.name
		r.enqueueDemo(id, order, 8000)
		fence := w.started(id, 10*time.Second)
		time.Sleep(time.Duration(100+rand.IntN(500)) * time.Millisecond)
		changed := time.Now()
		if err := change.do("lockstep:{lock:order:" + order + "}"); err != nil {
			t.Fatal(err)
		}
		lost := r.ended(fence, 5*time.Second)
		if lost.Outcome != demo.OutcomeLockLost {
			t.Fatalf("%s: execution ended %q, want lock_lost", change.name, lost.Outcome)
		}
		took := time.Duration(lost.FinishedMS-changed.UnixMilli()) * time.Millisecond
		t.Logf("%s: the run ended %v after the change (next renewal was 10s away)", change.name, took)
		if took > time.Second {
			t.Errorf("%s: the run ended %v after the change, want within 1s", change.name, took)
		}
		r.waitCompleted(i+1, 20*time.Second)
	}
	for id, n := range demo.CompletedTwice(readExecutions(t, admin)) {
		t.Errorf("task %s ended ok %d times", id, n)
	}
	oks := map[string]int{}
	for _, x := range readExecutions(t, admin) {
		if x.Outcome == demo.OutcomeOK {
			oks[x.TaskID]++
		}
	}
	if oks["loss-deleted"] != 1 || oks["loss-overwritten"] != 1 {
		t.Fatalf("ok executions per task: %v, want one each", oks)
	}
}

// A handler that returns nil after its lock was lost (it ignores its
// context) is done: it is not run again, the task completes without a retry,
// and the loss is counted and logged with the task id.
func TestNilAfterLossIsNotRunAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), defaultTTLYAML)
	w := r.start(bins["ignorer"], nil)
	admin := r.admin
	bg := context.Background()

	r.enqueueTest("test:ignore", "ign", 1500)
	w.started("ign", 10*time.Second)
	if err := admin.Del(bg, "lockstep:{lock:ignore:k}").Err(); err != nil {
		t.Fatal(err)
	}
	info := r.waitTask("default", "ign", asynq.TaskStateCompleted, 15*time.Second)
	if info.Retried != 0 {
		t.Fatalf("retried %d times, want 0: a handler that returned nil is done", info.Retried)
	}
	// A wrongly scheduled retry or requeue would be a task of the queue
	// still to run (pending, active, scheduled, retry, or parked, which is
	// scheduled): wait until the queue holds none, then count the runs.
	waitFor(t, 10*time.Second, "no task of the queue left to run", func() bool {
		q, err := r.insp.GetQueueInfo("default")
		return err == nil && q.Pending+q.Active+q.Scheduled+q.Retry+q.Aggregating == 0
	})
	if n := admin.XLen(bg, "test:ignorer:runs").Val(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
	w.waitLog(5*time.Second, "the loss logged with the task id", func(m map[string]any) bool {
		return strings.Contains(fmt.Sprint(m["msg"]), "lock") && m["task_id"] == "ign" && m["reason"] == "expired"
	})
	body := scrape(t, w.httpAddr(), 5*time.Second)
	if !strings.Contains(body, `lockstep_lock_lost_total{reason="expired"} 1`) {
		t.Fatalf("lock_lost_total{expired} is not 1:\n%s", grepLines(body, "lockstep_lock_lost_total"))
	}
	if !strings.Contains(body, `lockstep_jobs_processed_total{result="success",type="test:ignore"} 1`) {
		t.Fatalf("the run is not counted a success:\n%s", grepLines(body, "lockstep_jobs_processed_total"))
	}
}

// A holder frozen (SIGSTOP) mid-job past its TTL while a second worker takes
// the lock for the same order, then resumed (SIGCONT) at a random point of
// the second holder's run: the frozen holder's run never commits after the
// next holder began, and every job ends ok exactly once.
func TestPausedHolderCannotWriteAfterTheNextBegan(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	workers := []*proc{r.worker(), r.worker()}
	admin := r.admin

	const trials = 5
	var ids []string
	for i := range trials {
		order := fmt.Sprint("pause-", i)
		first, second := order+"-a", order+"-b"
		ids = append(ids, first, second)
		r.enqueueDemo(first, order, 2000)
		frozen, _ := whoLogged(t, workers, "job started", first)
		other := workers[0]
		if other == frozen {
			other = workers[1]
		}
		// Anywhere in the first renewal intervals, often just after one.
		time.Sleep(time.Duration(rand.IntN(int(2 * testRenewInterval))))
		frozen.Pause()
		r.enqueueDemo(second, order, 1500)
		other.started(second, 10*time.Second)
		time.Sleep(time.Duration(100+rand.IntN(1000)) * time.Millisecond)
		frozen.Resume()
		r.waitCompleted(2*(i+1), 30*time.Second)
	}

	r.check(ids) // every task ended ok once, no overlap, no stale write
	execs := readExecutions(t, admin)
	writes, err := demo.ReadWrites(context.Background(), admin, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, x := range execs {
		if x.Outcome == demo.OutcomeLockLost || x.Outcome == demo.OutcomeFenceRejected {
			lost++
		}
	}
	t.Logf("%d trials: %d executions, %d ended lock_lost or fence_rejected, %d accepted writes", trials, len(execs), lost, len(writes))
}

// /metrics answers within 1s while Redis is frozen (SIGSTOP).
func TestMetricsAnswerWhileRedisHangs(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	w := newRig(t, rs, testYAML).worker()
	addr := w.httpAddr()
	scrape(t, addr, 5*time.Second) // a first refresh with Redis up
	rs.Pause()
	defer rs.Resume()
	for range 3 {
		start := time.Now()
		body := scrape(t, addr, time.Second)
		if !strings.Contains(body, "lockstep_queue_metrics_age_seconds") || !strings.Contains(body, "lockstep_lock_lost_total") {
			t.Fatalf("scrape lacks lockstep's series:\n%s", body)
		}
		t.Logf("scrape with Redis frozen took %v", time.Since(start))
	}
}

// scrape GETs /metrics with a client timeout and returns the body.
func scrape(t *testing.T, addr string, timeout time.Duration) string {
	t.Helper()
	body, code := get("http://"+addr+"/metrics", timeout)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return body
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
