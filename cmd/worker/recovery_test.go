package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
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
		time.Sleep(rand.N(1500 * time.Millisecond)) // a random moment of the run
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
		delays = append(delays, d)
		t.Logf("round %d: %s ran again %v after its worker was killed (TTL %v)", i, id, d.Round(time.Millisecond), ttl)
		// The dead run's lock was renewed at most TTL/3 before the kill, so it
		// expired no earlier than 2/3 of the TTL after it.
		if d < ttl*2/3-50*time.Millisecond {
			t.Errorf("%s ran again %v after the kill: before the dead run's lock could have expired", id, d)
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
	if med := delays[len(delays)/2]; med > ttl+2*time.Second {
		t.Errorf("median delay %v, want within the TTL (%v) + 2s", med, ttl)
	}
	// No run overlapped the dead one (the rerun took the lock only once it
	// had expired), and each task ran to ok once.
	r.check(ids)
}
