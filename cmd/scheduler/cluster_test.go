package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// The scheduler on a 3-master Redis Cluster, with the built binaries and
// asynq's own cluster client. An overlap skip schedule (a tick every second,
// runs of 2.5 s, two replicas, three workers) never queues a run behind
// another and records the rest skipped (reason overlap); asynq's Inspector
// has each enqueued tick's task completed once, unretried, and none for a
// skipped tick, and the runs' fences rise without overlap. Then a backfill
// of a run-time schedule enqueues each past tick once (a second one finds
// them all), and each runs once, with leader backfill in lockstep ticks. No
// node replied CROSSSLOT to anyone.
func TestSchedulesOnCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	r := &overlapRig{t: t, cluster: c,
		cfg: writeRedisConfig(t, fmt.Sprintf("  mode: cluster\n  addrs: [%s]\n", strings.Join(c.Addrs(), ", ")), overlapSchedule("skip"))}
	r.startProcs()
	insp := asynq.NewInspector(asynq.RedisClusterClientOpt{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = insp.Close() })

	r.waitExecutions(3, 20*time.Second)
	r.stopReplicas()
	ticks := r.waitIdle(10 * time.Second)
	execs := r.executions()
	done, skipped := checkBacklog(t, ticks, execs, 0, nil)
	if done < 3 || skipped < 4 {
		t.Errorf("%d ticks done, %d skipped; want runs of 2.5s every second to skip about 2 ticks in 3", done, skipped)
	}
	var runs []demo.Execution
	for _, tk := range ticks {
		info, err := insp.GetTaskInfo("default", tk.TaskID)
		switch {
		case tk.State == "done":
			x := execs[tk.TaskID]
			runs = append(runs, x)
			if err != nil || info.State != asynq.TaskStateCompleted || info.Retried != 0 || x.Outcome != demo.OutcomeOK {
				t.Errorf("tick %v (%s): asynq's Inspector %v %v, run %+v; want completed, unretried, ok", tk.Tick, tk.TaskID, info, err, x)
			}
		case tk.TaskID != "" && !errors.Is(err, asynq.ErrTaskNotFound):
			t.Errorf("tick %v skipped, yet asynq has its task %s: %v %v", tk.Tick, tk.TaskID, info, err)
		}
	}
	for _, err := range demo.Overlaps(runs) {
		t.Error(err)
	}
	t.Logf("overlap skip: %d ticks, %d enqueued, %d skipped", len(ticks), done, skipped)

	// A backfill of a run-time schedule.
	if code, out := r.lockstep("schedules", "add", "bf", "--cron", "* * * * * *", "--task", demo.Type,
		"--payload", `{"order_id":"bf","work_ms":10}`); code != 0 {
		t.Fatalf("schedules add: exit %d: %s", code, out)
	}
	from := time.Now().Truncate(time.Second).Add(-10 * time.Second)
	to := from.Add(4 * time.Second)
	var ids []string
	for _, again := range []bool{false, true} {
		code, bf, out := r.backfill("bf", "--from", rfc(from), "--to", rfc(to), "--json")
		if code != 0 || len(bf) != 5 {
			t.Fatalf("backfill: exit %d, %d ticks, want 5: %s", code, len(bf), out)
		}
		for _, tk := range bf {
			want := scheduler.BackfillEnqueued
			if again {
				want = scheduler.BackfillExists
			}
			if tk.Result != want || tk.TaskID != scheduler.TaskID("bf", tk.Tick) {
				t.Errorf("backfill (again: %v): tick %v: %q %s, want %q", again, tk.Tick, tk.Result, tk.TaskID, want)
			}
			if !again {
				ids = append(ids, tk.TaskID)
			}
		}
	}
	for _, id := range ids {
		redistest.WaitFor(t, 20*time.Second, id+" completed", func() bool {
			info, err := insp.GetTaskInfo("default", id)
			return err == nil && info.State == asynq.TaskStateCompleted && info.Retried == 0
		})
	}
	var bfRuns []demo.Execution
	for _, x := range r.executions() {
		if x.OrderID == "bf" {
			bfRuns = append(bfRuns, x)
		}
	}
	var ran []string
	for _, x := range bfRuns {
		if x.Outcome == demo.OutcomeOK {
			ran = append(ran, x.TaskID)
		}
	}
	slices.Sort(ran)
	if !slices.Equal(ran, ids) {
		t.Errorf("backfilled ticks ran to ok: %v, want each of %v once", ran, ids)
	}
	code, out := r.lockstep("ticks", "bf", "--last", "10", "--json")
	if code != 0 || strings.Count(out, `"leader": "backfill"`) != 5 {
		t.Errorf("lockstep ticks bf: exit %d, want 5 ticks with leader backfill:\n%s", code, out)
	}
	if n := c.Errors()["CROSSSLOT"]; n != 0 {
		t.Errorf("the cluster's nodes replied CROSSSLOT %d times", n)
	}
}
