package main

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// A worker is SIGKILLed at a random moment of a long locked job: the job
// runs again on a live worker within its lock's TTL and a little (G7), not
// after asynq's lease and recoverer (30 s and more), never before the dead
// run's lock has expired, once to ok, with a higher fence, and without
// using a retry.
func TestKilledWorkersJobRunsAgainWithinItsLockTTL(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	r := newRig(t, redistest.Start(t), strings.Replace(testYAML, "ttl: 600ms", "ttl: 1s", 1))
	killRunsAgain(t, r, nil, ttl, 4)
}

// The same on the etcd back end, whose locks live away from the queue: the
// hold record and the done marker are written beside the queue.
func TestKilledWorkersJobRunsAgainOnEtcd(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // the shortest etcd allows with its default election timeout
	r := newRig(t, redistest.Start(t), strings.Replace(testYAML, "ttl: 600ms", "ttl: 3s", 1))
	ec := etcdtest.Start(t)
	killRunsAgain(t, r, []string{"LOCKSTEP_LOCK_BACKEND=etcd", "LOCKSTEP_LOCK_ETCD_ENDPOINTS=" + strings.Join(ec.Endpoints(), ",")}, ttl, 2)
}

// killRunsAgain SIGKILLs, rounds times, the worker running a long locked
// job at a random moment of it (two workers, env added), and checks that
// the job ran again within the TTL + 3 s (median + 2 s), never before the
// dead run's lock could have expired, once to ok, without using a retry.
func killRunsAgain(t *testing.T, r *rig, env []string, ttl time.Duration, rounds int) {
	t.Helper()
	start := func() *proc { return r.start(bins["worker"], env) }
	workers := []*proc{start(), start()}
	var delays []time.Duration
	ids := names("long", rounds)
	for i, id := range ids {
		r.enqueueDemo(id, "rec"+id, int(ttl.Milliseconds())+3000)
		victim, rec := whoLogged(t, workers, "job started", id)
		first := fenceOf(rec)
		late := proctest.MeasureLateness(t)
		time.Sleep(rand.N(1500 * time.Millisecond)) // a random moment of the run
		// The dead run's lock expires no earlier than its last renewal and
		// the TTL: on Redis, its PTTL read just before the kill; elsewhere,
		// renewed at most TTL/3 before the kill (later by as much as this
		// machine delays timers: measured), 2/3 of the TTL after it.
		expires := ttl*2/3 - late.Max()
		if env == nil {
			expires = r.admin.PTTL(context.Background(), "lockstep:{lock:order:rec"+id+"}").Val()
		}
		victim.Kill()
		killed := time.Now()
		workers = slices.DeleteFunc(workers, func(w *proc) bool { return w == victim })
		workers = append(workers, start())
		var again execution
		waitFor(t, 20*time.Second, id+" run again", func() bool {
			for _, x := range readExecutions(t, r.admin) {
				if x.TaskID == id && x.Fence > first {
					again = x
					return true
				}
			}
			return false
		})
		d := time.UnixMilli(again.StartedMS).Sub(killed)
		if d < -50*time.Millisecond {
			// The run again began before the kill: the victim had lost its
			// lock while alive, frozen past its TTL by the machine's load
			// (the lock service gave it to the rerun only once expired, as
			// its higher fence says). G7 treats a freeze as a crash; the
			// kill's timing says nothing more in this round.
			// A live worker must have judged it dead first (its beats
			// overdue): a rerun beside a live holder is two holders.
			judged := false
			for _, w := range workers {
				judged = judged || w.findLog(proctest.Msg("dead worker's task recovered: its lock expired; back at the head of its queue",
					"id", id, "worker", procid.Of(victim.Pid()))) != nil
			}
			if !judged {
				t.Errorf("%s ran again %v before its worker was killed, and no live worker had judged that worker dead: two holders at once", id, -d)
			}
			t.Logf("round %d: %s ran again %v before its worker was killed: the victim was frozen past its TTL (timers here up to %v late)", i, id, -d.Round(time.Millisecond), late.Max())
		} else {
			delays = append(delays, d)
			t.Logf("round %d: %s ran again %v after its worker was killed (TTL %v)", i, id, d.Round(time.Millisecond), ttl)
		}
		if d >= -50*time.Millisecond && d < expires-50*time.Millisecond {
			t.Errorf("%s ran again %v after the kill: before the dead run's lock could have expired (%v)", id, d, expires)
		}
		if d > ttl+3*time.Second {
			t.Errorf("%s ran again %v after the kill, want within the TTL (%v) + 3s", id, d, ttl)
		}
		info := r.waitTask(demo.Queue, id, asynq.TaskStateCompleted, 30*time.Second)
		if info.Retried != 0 {
			t.Errorf("%s retried %d times: a crash is not the task's failure", id, info.Retried)
		}
	}
	slices.Sort(delays)
	if len(delays) == 0 {
		t.Fatalf("every victim was frozen past its TTL before its kill: no round measured a recovery")
	}
	if med := delays[len(delays)/2]; med > ttl+2*time.Second {
		t.Errorf("median delay %v, want within the TTL (%v) + 2s", med, ttl)
	}
	// No run overlapped the dead one (the rerun took the lock only once it
	// had expired), and each task ran to ok once.
	r.check(ids)
}

// A worker SIGKILLed while it runs tasks that take no lock: a live worker
// brings each back as soon as the dead one's beats are overdue (their bare
// records), not after asynq's lease (30 s, and its recoverer's minute),
// never before the kill; each runs again to its end once, without using a
// retry.
func TestKilledWorkersUnlockedTasksComeBack(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), testYAML)
	victim := r.start(bins["ignorer"], nil)
	victim.waitLog(10*time.Second, "the first worker to start", proctest.Msg("worker started"))
	ids := names("free", 3)
	for _, id := range ids {
		r.enqueueTest("test:free", id, 3000)
	}
	waitFor(t, 10*time.Second, "the first worker to start every task", func() bool {
		return len(readFreeStarts(t, r.admin)) == len(ids)
	})
	rescuer := r.start(bins["ignorer"], nil)
	rescuer.waitLog(10*time.Second, "the second worker to start", proctest.Msg("worker started"))
	victim.Kill()
	killed := time.Now()

	for _, id := range ids {
		info := r.waitTask("default", id, asynq.TaskStateCompleted, 30*time.Second)
		if info.Retried != 0 {
			t.Errorf("%s used %d retries; a crash is not the task's failure", id, info.Retried)
		}
		rescuer.waitLog(time.Second, id+"'s recovery", proctest.Msg("dead worker's task recovered: it held no lock; back at the head of its queue", "id", id))
	}
	starts := readFreeStarts(t, r.admin)
	for _, id := range ids {
		if len(starts[id]) != 2 {
			t.Errorf("%s started %d times, want twice (killed once, then to its end)", id, len(starts[id]))
			continue
		}
		again := time.UnixMilli(starts[id][1])
		switch d := again.Sub(killed); {
		case d < -50*time.Millisecond:
			t.Errorf("%s ran again %v before its worker was killed", id, -d)
		case d > recoveryBound:
			t.Errorf("%s ran again %v after its worker was killed, want within %v", id, d, recoveryBound)
		default:
			t.Logf("%s ran again %v after its worker was killed", id, d.Round(time.Millisecond))
		}
	}
}

// readFreeStarts returns the start times (Unix ms) of test:free's runs by task id.
func readFreeStarts(t *testing.T, c *redis.Client) map[string][]int64 {
	t.Helper()
	msgs, err := c.XRange(context.Background(), "test:free:runs", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	starts := map[string][]int64{}
	for _, m := range msgs {
		if m.Values["event"] == "start" {
			id, _ := m.Values["task_id"].(string)
			at, _ := strconv.ParseInt(m.Values["at_ms"].(string), 10, 64)
			starts[id] = append(starts[id], at)
		}
	}
	return starts
}
