package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// NotAvailable is the value of a count whose check could not be made (its
// history source is missing); it is never reported as 0.
const NotAvailable = -1

// redisGrace is how long after Redis is healthy again an overlap is still
// put down to the Redis fault: a holder whose write was queued in the paused
// server learns of its result only after the server resumes.
const redisGrace = 2 * time.Second

// attribution is how long after a fault healed a violation is put down to it
// in the per-fault table.
const attribution = 10 * time.Second

// maxEvidence caps the violations listed one by one in a report.
const maxEvidence = 50

// Report is what Check finds. The first integer fields are a contract
// (docs/chaos.md); a count is NotAvailable (-1) when its check could not be made.
type Report struct {
	Seed                          uint64 `json:"seed"`
	Lock                          string `json:"lock_backend"`
	Store                         string `json:"demo_store"`
	Overlaps                      int    `json:"overlaps"`
	StaleWritesAccepted           int    `json:"stale_writes_accepted"`
	JobsLost                      int    `json:"jobs_lost"`
	JobsCompletedTwiceUnexplained int    `json:"jobs_completed_twice_unexplained"`
	TicksClaimedTwice             int    `json:"ticks_claimed_twice"`
	TicksMissing                  int    `json:"ticks_missing"`
	// RecoveredFromLive counts tasks a worker brought back from a worker it
	// judged dead while that worker was neither killed, paused nor cut off
	// (G7's recovery may act only on a holder that is gone).
	RecoveredFromLive int            `json:"recovered_from_live_workers"`
	Faults            map[string]int `json:"faults"`
	// OverLimit counts instants when more ok syncs of one tenant ran than
	// its limit (3) while Redis was healthy (G3 for permits; two syncs on
	// one permit at once count in Overlaps).
	OverLimit int `json:"over_limit"`
	// TenantSyncs is how many ok syncs of tenants were checked, and
	// TenantMaxAtOnce the most of one tenant that ran at once.
	TenantSyncs     int `json:"tenant_syncs_checked"`
	TenantMaxAtOnce int `json:"tenant_max_at_once"`
	// RateOverGrants counts the starts of rate-limited calls that open a
	// window of one client's starts, at their admission times (Redis's
	// clock), holding more than N·w/Per + Burst of them (G11), and the
	// starts that no admission counted. RatedStarts is how many starts were
	// checked, RatedMaxInWindow the closest any window came (starts over
	// the bound's value, ≤ 1 when within), RatedStartLagMaxMS the longest a
	// start followed its admission.
	RateOverGrants     int     `json:"rate_over_grants"`
	RatedStarts        int     `json:"rated_starts_checked"`
	RatedMaxInWindow   float64 `json:"rated_max_window_fill"`
	RatedStartLagMaxMS int64   `json:"rated_start_lag_max_ms"`

	// LostHoldersLate counts, on a Redis Cluster, runs whose lock a
	// failover may have lost (their resource on the master that failed,
	// running when it failed) that were still running when the store
	// accepted the next holder's fenced begin: a lock lost in a failover
	// (DESIGN §1) must have cost its holder its context before the next
	// holder began its work.
	LostHoldersLate int `json:"lost_holders_not_cancelled"`

	// Counts docs/chaos.md explains, and the sizes of what was checked.
	OverlapsRedisUnhealthy int `json:"overlaps_redis_unhealthy"`
	// OverlapsFailover counts overlaps of ok runs of a resource of a
	// Cluster master that failed over, each of whose first run's commit
	// the store accepted before the second's begin: the lock was lost in
	// the failover, and the fences kept the store's order.
	OverlapsFailover            int `json:"overlaps_failover"`
	JobsCompletedTwiceExplained int `json:"jobs_completed_twice_explained"`
	// ExecutionRecordsDuplicated counts ok records repeating a task's fence:
	// one run recorded twice, not a second run.
	ExecutionRecordsDuplicated int            `json:"execution_records_duplicated"`
	JobsEnqueued               int            `json:"jobs_enqueued"`
	JobsUnacked                int            `json:"jobs_unacked"`
	JobsCompleted              int            `json:"jobs_completed"`
	JobsArchived               int            `json:"jobs_archived"`
	JobsUnfinished             int            `json:"jobs_unfinished"`
	Executions                 map[string]int `json:"executions"`
	WritesChecked              int            `json:"writes_checked"`
	TicksChecked               int            `json:"ticks_checked"`
	TicksEnqueuedTwice         int            `json:"ticks_enqueued_twice"`
	TicksTakenOver             int            `json:"ticks_taken_over"`
	TicksSkippedOverlap        int            `json:"ticks_skipped_overlap"` // no task: the overlap policy skipped them
	DurationSeconds            float64        `json:"duration_seconds"`

	// PerFault is, for each fault kind, what followed it.
	PerFault map[string]*FaultStats `json:"per_fault"`
	// Failovers is, for each kind of fault of a Cluster master, what it
	// cost the runs.
	Failovers map[string]*FailoverCost `json:"failovers"`
	// RecoveryMS is, for each kind of worker kill, the time from the kill
	// to each task the killed worker was running (it had begun its fenced
	// write and not finished) starting again on some worker: {p50, max} in
	// milliseconds and how many tasks. RecoveryOverBound counts the
	// producer's jobs that a SIGKILL mid-work (worker_kill) cut off and that
	// started again later than the lock TTL + 3 s (G7's bound); it is
	// reported, not yet a violation: after a Redis kill shortly before the
	// worker kill some still come back only by asynq's lease (docs/chaos.md).
	RecoveryMS        map[string]*Spread `json:"recovery_ms"`
	RecoveryOverBound int                `json:"recovery_over_bound"`
	RecoveryLate      []string           `json:"recovery_late"` // each of RecoveryOverBound, said

	// NotChecked names each check that could not be made, or was made on an
	// incomplete history, and why.
	NotChecked []string `json:"not_checked"`
	// Evidence lists violations one by one (at most 50).
	Evidence []Violation `json:"evidence"`
}

// FaultStats is what followed the faults of one kind.
type FaultStats struct {
	Count int `json:"count"`
	// Violations within 10s of one of these faults healing.
	Violations int `json:"violations"`
	// Time from the fault healing to the next ok execution and the next
	// tick enqueued, in milliseconds; -1 when none followed.
	JobsResumedMaxMS  int64 `json:"jobs_resumed_max_ms"`
	JobsResumedP50MS  int64 `json:"jobs_resumed_p50_ms"`
	TicksResumedMaxMS int64 `json:"ticks_resumed_max_ms"`
	TicksResumedP50MS int64 `json:"ticks_resumed_p50_ms"`
	// Unrecovered counts faults after which no job or no tick followed.
	Unrecovered int `json:"unrecovered"`
}

// FailoverCost is what the faults of one kind of a Cluster master cost.
type FailoverCost struct {
	Count int `json:"count"`
	// Promoted is how many of them had the master's replica take over, and
	// PromotedMS the time from the fault to the promotion.
	Promoted   int    `json:"promoted"`
	PromotedMS Spread `json:"promoted_ms"`
	// HoldersCancelled counts the runs under way when the fault began (their
	// fenced begin accepted, their commit not yet) that never committed: of
	// the master's resources, and of the others (every master answers
	// CLUSTERDOWN until the promotion).
	HoldersCancelled          int `json:"holders_cancelled"`
	HoldersCancelledElsewhere int `json:"holders_cancelled_elsewhere"`
	// ResumedMS is, for each such run, the time from the fault to its
	// task's next accepted begin; NotResumed counts those whose task never
	// began again.
	ResumedMS  Spread `json:"jobs_resumed_ms"`
	NotResumed int    `json:"not_resumed"`
	// LocksBackMS is, for each fault that promoted the replica, the time
	// from the fault to the first fenced begin of a run of the master's
	// resources after the promotion: how long the jobs of its locks were
	// held up.
	LocksBackMS Spread `json:"locks_back_ms"`
}

// Spread summarizes durations in milliseconds: the median, the maximum
// and how many.
type Spread struct {
	P50   int64 `json:"p50"`
	Max   int64 `json:"max"`
	Tasks int   `json:"tasks"`
}

// Violation is one finding, with what it is about.
type Violation struct {
	Check  string    `json:"check"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail"`
}

// Violations is the sum of the contract counts that are available.
func (r *Report) Violations() int {
	n := 0
	for _, v := range []int{r.Overlaps, r.StaleWritesAccepted, r.JobsLost, r.JobsCompletedTwiceUnexplained,
		r.TicksClaimedTwice, r.TicksMissing, r.TicksEnqueuedTwice, r.OverLimit, r.RecoveredFromLive, r.RateOverGrants,
		r.RecoveryOverBound, r.LostHoldersLate} {
		if v > 0 {
			n += v
		}
	}
	return n
}

// Check runs every check over h.
func Check(h History) *Report {
	r := &Report{
		Seed:            h.Seed,
		Lock:            h.Lock,
		Store:           h.Store,
		Faults:          map[string]int{},
		Executions:      map[string]int{},
		PerFault:        map[string]*FaultStats{},
		Failovers:       map[string]*FailoverCost{},
		RecoveryMS:      map[string]*Spread{},
		RecoveryLate:    []string{},
		DurationSeconds: h.End.Sub(h.Start).Seconds(),
		NotChecked:      []string{},
		Evidence:        []Violation{},
	}
	var found []Violation
	add := func(v Violation) { found = append(found, v) }

	// A run is one acquire: one fence. A record repeating a task's fence and
	// outcome is one run recorded twice (the record's XADD retried after a
	// timeout that hid its success), not a second run: it is counted and
	// left out of the checks.
	type run struct {
		task    string
		fence   int64
		outcome string
	}
	seen := map[run]bool{}
	execs := h.Executions[:0:0]
	for _, e := range h.Executions {
		k := run{e.TaskID, e.Fence, e.Outcome}
		if seen[k] {
			r.ExecutionRecordsDuplicated++
			continue
		}
		seen[k] = true
		execs = append(execs, e)
	}
	h.Executions = execs

	for _, e := range h.Executions {
		r.Executions[e.Outcome]++
	}
	if !h.ExecutionsComplete {
		r.NotChecked = append(r.NotChecked, "overlaps, jobs_completed_twice: the executions stream is incomplete (trimmed or unreadable)")
	}
	r.Overlaps, r.OverlapsRedisUnhealthy, r.OverlapsFailover = checkOverlaps(h, add)
	r.LostHoldersLate = checkLostHolders(h, r, add)
	failoverCosts(h, r)
	r.OverLimit, r.TenantSyncs, r.TenantMaxAtOnce = checkLimit(h, add)
	r.StaleWritesAccepted = checkWrites(h, r, add)
	checkRate(h, r, add)
	checkJobs(h, r, add)
	r.RecoveredFromLive = checkRecoveries(h, add)
	checkRecoveryTimes(h, r, add)
	checkTicks(h, r, add)
	perFault(h, r, found)

	slices.SortFunc(found, func(a, b Violation) int { return a.At.Compare(b.At) })
	r.Evidence = append(r.Evidence, found[:min(len(found), maxEvidence)]...)
	return r
}

// checkOverlaps counts ok executions of one order that started before an
// earlier ok execution of that order had finished (G3), apart from those
// that touch a time when Redis was paused or down, and those of a resource
// of a Cluster master that failed over, during the failover, whose first
// run's commit the store accepted before the second's begin (DESIGN §1: a
// failover may lose a lock; the fences kept the store right).
// A tenant's syncs are checked per permit: "tenant <id> permit <k>".
func checkOverlaps(h History, add func(Violation)) (overlaps, unhealthy, failedOver int) {
	touches := sickness(h)
	lost := failedOverAt(h)
	store := storeOrder(h)
	byOrder := okRunsBy(h, runKey)
	for _, order := range slices.Sorted(maps.Keys(byOrder)) {
		runs := byOrder[order]
		var last Execution // the run that finishes last so far
		for i, e := range runs {
			if i > 0 && e.Started.Before(last.Finished) {
				if touches(e.Started, last.Finished) {
					unhealthy++
				} else if lost(order, e.Started, last.Finished) && store.before(last, "commit", e, "begin") {
					failedOver++
				} else {
					overlaps++
					add(Violation{Check: "overlaps", At: e.Started, Detail: fmt.Sprintf(
						"order %s: task %s (fence %d, %s) started %v before task %s (fence %d, %s) finished",
						order, e.TaskID, e.Fence, e.Worker, last.Finished.Sub(e.Started).Round(time.Millisecond),
						last.TaskID, last.Fence, last.Worker)})
				}
			}
			if i == 0 || e.Finished.After(last.Finished) {
				last = e
			}
		}
	}
	return overlaps, unhealthy, failedOver
}

// failedOverAt returns whether a span of time touches a failover of the
// Cluster master that served resource's lock (a fault that promoted its
// replica, from its start to redisGrace after it healed).
func failedOverAt(h History) func(resource string, a, b time.Time) bool {
	return func(resource string, a, b time.Time) bool {
		for _, f := range h.Faults {
			if failover(f.Kind) && !f.Promoted.IsZero() && slices.Contains(f.Resources, resource) &&
				a.Before(f.End.Add(redisGrace)) && b.After(f.Start) {
				return true
			}
		}
		return false
	}
}

// writeName is the name the accepted-writes log gives e's record: the
// order, or "tenant <tenant>/<permit>".
func writeName(e Execution) string {
	if e.TenantID != "" {
		return fmt.Sprintf("tenant %s/%d", e.TenantID, e.Permit)
	}
	return e.OrderID
}

// writeLog is the accepted-writes log by record, each in the store's order.
type writeLog map[string][]Write

func storeOrder(h History) writeLog {
	by := writeLog{}
	for _, w := range h.Writes {
		by[w.OrderID] = append(by[w.OrderID], w)
	}
	return by
}

// find returns the index of e's write op in its record's log, or -1.
func (l writeLog) find(e Execution, op string) int {
	return slices.IndexFunc(l[writeName(e)], func(w Write) bool { return w.TaskID == e.TaskID && w.Fence == e.Fence && w.Op == op })
}

// before reports whether the store accepted a's write opA before b's opB.
func (l writeLog) before(a Execution, opA string, b Execution, opB string) bool {
	i, j := l.find(a, opA), l.find(b, opB)
	return i >= 0 && j >= 0 && i < j
}

// checkLostHolders counts the runs a failover may have taken the lock of
// (their resource on the Cluster master that failed over, running when the
// fault began) that were still running when the store accepted the next
// holder's begin (a higher fence) of their record: such a holder did not
// learn of its loss before the next began its work (LostHoldersLate).
func checkLostHolders(h History, r *Report, add func(Violation)) int {
	if !slices.ContainsFunc(h.Faults, func(f Fault) bool { return failover(f.Kind) && !f.Promoted.IsZero() }) {
		return 0
	}
	if !h.WritesAvailable {
		r.NotChecked = append(r.NotChecked, "lost_holders_not_cancelled: the demo store keeps no log of its writes")
		return NotAvailable
	}
	store := storeOrder(h)
	late := 0
	for _, e := range h.Executions {
		var f *Fault
		for i := range h.Faults {
			g := &h.Faults[i]
			if failover(g.Kind) && !g.Promoted.IsZero() && slices.Contains(g.Resources, runKey(e)) &&
				e.Started.Before(g.Start) && e.Finished.After(g.Start) {
				f = g
				break
			}
		}
		if f == nil {
			continue
		}
		for _, w := range store[writeName(e)] {
			if w.Op != "begin" || w.Fence <= e.Fence {
				continue
			}
			// The log's times are Redis's, in whole milliseconds.
			if e.Finished.After(w.At.Add(time.Millisecond)) {
				late++
				add(Violation{Check: "lost_holders_not_cancelled", At: w.At, Detail: fmt.Sprintf(
					"%s: task %s (fence %d, %s), running when %s %s began, ran on %v after task %s (fence %d, %s) began its work; it ended %s",
					runKey(e), e.TaskID, e.Fence, e.Worker, f.Kind, f.Target, e.Finished.Sub(w.At).Round(time.Millisecond),
					w.TaskID, w.Fence, w.Worker, e.Outcome)})
			}
			break
		}
	}
	return late
}

// failoverCosts measures what each kind of fault of a Cluster master cost
// the runs (Report.Failovers), from the store's log of accepted writes:
// a run under way is one whose fenced begin was accepted in the 5 s before
// the fault (the longest work and a lock TTL) and its commit not before it;
// it was cut off when its commit never came (the executions stream has no
// record of a run whose store could not be reached). Its task resumed at
// its next accepted begin.
func failoverCosts(h History, r *Report) {
	const underWay = 5 * time.Second
	resumed := map[string][]int64{}
	promoted := map[string][]int64{}
	back := map[string][]int64{}
	type run struct {
		task  string
		fence int64
	}
	committed := map[run]bool{}
	for _, w := range h.Writes {
		if w.Op == "commit" {
			committed[run{w.TaskID, w.Fence}] = true
		}
	}
	for _, f := range h.Faults {
		if !slices.Contains(ClusterFaults, f.Kind) || f.Kind == FaultClusterReplicaKill {
			continue
		}
		c := r.Failovers[f.Kind]
		if c == nil {
			c = &FailoverCost{}
			r.Failovers[f.Kind] = c
		}
		c.Count++
		if !f.Promoted.IsZero() {
			c.Promoted++
			promoted[f.Kind] = append(promoted[f.Kind], f.Promoted.Sub(f.Start).Milliseconds())
			var first time.Time
			for _, w := range h.Writes {
				if w.Op == "begin" && w.At.After(f.Promoted) && slices.Contains(f.Resources, recordRunKey(w.OrderID)) &&
					(first.IsZero() || w.At.Before(first)) {
					first = w.At
				}
			}
			if !first.IsZero() {
				back[f.Kind] = append(back[f.Kind], first.Sub(f.Start).Milliseconds())
			}
		}
		for _, w := range h.Writes {
			if w.Op != "begin" || !w.At.Before(f.Start) || w.At.Before(f.Start.Add(-underWay)) || committed[run{w.TaskID, w.Fence}] {
				continue
			}
			if slices.Contains(f.Resources, recordRunKey(w.OrderID)) {
				c.HoldersCancelled++
			} else {
				c.HoldersCancelledElsewhere++
			}
			var next time.Time
			for _, x := range h.Writes {
				if x.TaskID == w.TaskID && x.Op == "begin" && x.At.After(f.Start) && (next.IsZero() || x.At.Before(next)) {
					next = x.At
				}
			}
			if next.IsZero() {
				c.NotResumed++
				continue
			}
			resumed[f.Kind] = append(resumed[f.Kind], next.Sub(f.Start).Milliseconds())
		}
	}
	if len(r.Failovers) > 0 && !h.WritesAvailable {
		r.NotChecked = append(r.NotChecked, "failovers: holders cancelled and jobs resumed: the demo store keeps no log of its writes")
	}
	for kind, c := range r.Failovers {
		c.ResumedMS = spread(resumed[kind])
		c.PromotedMS = spread(promoted[kind])
		c.LocksBackMS = spread(back[kind])
	}
}

// recordRunKey is the runKey of the record the accepted-writes log names
// name (writeName's inverse).
func recordRunKey(name string) string {
	if rest, ok := strings.CutPrefix(name, "tenant "); ok {
		if tenant, permit, ok := strings.Cut(rest, "/"); ok {
			return fmt.Sprintf("tenant %s permit %s", tenant, permit)
		}
	}
	return name
}

// spread summarizes v (milliseconds); -1s when v is empty.
func spread(v []int64) Spread {
	m, p50 := maxAndMedian(v)
	return Spread{P50: p50, Max: m, Tasks: len(v)}
}

// checkWrites counts writes the fenced store accepted with a fence below one
// that had already begun (or committed) on the same order (G5).
func checkWrites(h History, r *Report, add func(Violation)) int {
	if !h.WritesAvailable {
		r.NotChecked = append(r.NotChecked, "stale_writes_accepted: the demo store keeps no log of accepted writes (stream or table absent)")
		return NotAvailable
	}
	if !h.WritesComplete {
		r.NotChecked = append(r.NotChecked, "stale_writes_accepted: the accepted-writes log is incomplete (trimmed or unreadable)")
	}
	r.WritesChecked = len(h.Writes)
	type high struct {
		fence int64
		task  string
	}
	top := map[string]high{}
	stale := 0
	for _, w := range h.Writes {
		t := top[w.OrderID]
		if w.Fence < t.fence {
			stale++
			add(Violation{Check: "stale_writes_accepted", At: w.At, Detail: fmt.Sprintf(
				"order %s: %s with fence %d (task %s, %s) accepted after fence %d (task %s) had begun",
				w.OrderID, w.Op, w.Fence, w.TaskID, w.Worker, t.fence, t.task)})
			continue
		}
		top[w.OrderID] = high{w.Fence, w.TaskID}
	}
	return stale
}

// checkJobs finds produced jobs that never completed (G7) and tasks that
// completed more than once, split into those asynq's at-least-once explains
// (a worker killed after its handler returned, or a completion asynq logged
// it could not record: Redis down or loading at that moment) and the rest.
func checkJobs(h History, r *Report, add func(Violation)) {
	for _, j := range h.Jobs {
		if !j.Acked {
			r.JobsUnacked++
			continue
		}
		r.JobsEnqueued++
		switch j.State {
		case "completed":
			r.JobsCompleted++
		case "", "archived":
			r.JobsLost++
			if j.State == "archived" {
				r.JobsArchived++
			}
			what := "asynq has no such task"
			if j.State != "" {
				what = "archived: retries exhausted"
			}
			add(Violation{Check: "jobs_lost", At: h.End, Detail: fmt.Sprintf("job %s (order %s): %s", j.ID, j.OrderID, what)})
		default:
			r.JobsUnfinished++
		}
	}
	if r.JobsUnfinished > 0 {
		r.NotChecked = append(r.NotChecked, fmt.Sprintf("jobs_lost: %d jobs were still unfinished when the drain ended", r.JobsUnfinished))
	}

	byTask := okRunsBy(h, func(e Execution) string { return e.TaskID })
	for _, id := range slices.Sorted(maps.Keys(byTask)) {
		runs := byTask[id]
		if len(runs) < 2 {
			continue
		}
		unexplained := 0
		for i := 1; i < len(runs); i++ {
			if !killedBetween(h.Faults, runs[i-1].Worker, runs[i-1].Finished, runs[i].Started) &&
				!loggedBetween(h.CompletionsNotRecorded[id], runs[i-1].Finished, runs[i].Started) &&
				!frozenUnrecorded(h.Faults, runs[i-1].Worker, runs[i-1].Finished, runs[i].Started, h.CompletionsNotRecorded[id]) {
				unexplained++
				add(Violation{Check: "jobs_completed_twice_unexplained", At: runs[i].Started, Detail: fmt.Sprintf(
					"task %s ran ok on %s (fence %d, finished %s) and again on %s (fence %d); no kill of %s in between, and no worker logged that asynq could not record the first completion",
					id, runs[i-1].Worker, runs[i-1].Fence, runs[i-1].Finished.Format(time.StampMilli),
					runs[i].Worker, runs[i].Fence, runs[i-1].Worker)})
			}
		}
		if unexplained > 0 {
			r.JobsCompletedTwiceUnexplained++
		} else {
			r.JobsCompletedTwiceExplained++
		}
	}
}

// recoverySlack is how long after a paused or cut-off worker came back a
// recovery of its tasks may still have been decided while it was away.
const recoverySlack = time.Second

// checkRecoveries counts recoveries of a worker that no fault had stopped:
// killed before the recovery, or paused or cut off until shortly before it.
func checkRecoveries(h History, add func(Violation)) int {
	n := 0
	for _, rc := range h.Recoveries {
		if slices.ContainsFunc(h.Faults, func(f Fault) bool {
			if f.Worker != rc.Dead || f.Start.After(rc.At) {
				return false
			}
			return workerKill(f.Kind) || !f.End.Add(recoverySlack).Before(rc.At)
		}) {
			continue
		}
		n++
		add(Violation{Check: "recovered_from_live_workers", At: rc.At, Detail: fmt.Sprintf(
			"task %s was brought back from worker %s, judged dead, but no fault had killed, paused or cut it off", rc.TaskID, rc.Dead)})
	}
	return n
}

// loggedBetween reports whether one of times lies between from (less a
// second: log and record clocks are read apart) and to.
func loggedBetween(times []time.Time, from, to time.Time) bool {
	for _, t := range times {
		if !t.Before(from.Add(-time.Second)) && !t.After(to) {
			return true
		}
	}
	return false
}

// frozenUnrecorded reports whether worker was frozen past the lock TTL
// (worker_pause_long) from before to (the second run's start) until after
// from (the first run's end), and logged, once it resumed, that asynq could
// not record the first run's completion: its handler had returned, but it
// froze before it or asynq recorded anything, and it was judged dead as a
// killed worker is (G7). That is asynq's at-least-once window, which DESIGN
// §1 leaves to handlers idempotent under their fence, as for a kill.
func frozenUnrecorded(faults []Fault, worker string, from, to time.Time, logged []time.Time) bool {
	for _, f := range faults {
		if f.Kind == FaultWorkerPauseLong && f.Worker == worker && !f.End.Before(from) && !f.Start.After(to) &&
			loggedBetween(logged, from, f.End.Add(5*time.Second)) {
			return true
		}
	}
	return false
}

// killedBetween reports whether worker was killed between from and to.
func killedBetween(faults []Fault, worker string, from, to time.Time) bool {
	for _, f := range faults {
		if workerKill(f.Kind) && f.Worker == worker && !f.End.Before(from) && !f.Start.After(to) {
			return true
		}
	}
	return false
}

// checkTicks finds ticks claimed by two replicas other than by a takeover of
// an unfinished tick (G1), ticks enqueued fresh twice, and ticks of the
// checked window that have no task in asynq (G2).
func checkTicks(h History, r *Report, add func(Violation)) {
	if !h.ReplicaLogsComplete {
		r.NotChecked = append(r.NotChecked, "ticks_claimed_twice: a scheduler replica's log could not be read in full")
	}
	type key struct {
		s string
		t int64
	}
	// twice counts and reports each tick that more than one of events
	// (those keep accepts) is about.
	twice := func(events []TickEvent, keep func(TickEvent) bool, check, what string) (n int) {
		byTick := map[key][]TickEvent{}
		for _, e := range events {
			if keep(e) {
				k := key{e.Schedule, e.Tick}
				byTick[k] = append(byTick[k], e)
			}
		}
		for k, es := range byTick {
			if len(es) > 1 {
				n++
				add(Violation{Check: check, At: time.Unix(k.t, 0), Detail: fmt.Sprintf(
					"%s tick %d %s %d times: %s", k.s, k.t, what, len(es), describeClaims(es))})
			}
		}
		return n
	}
	for _, c := range h.Claims {
		if c.Kind == "takeover" {
			r.TicksTakenOver++
		}
	}
	r.TicksClaimedTwice = twice(h.Claims, func(c TickEvent) bool { return c.Kind != "takeover" }, "ticks_claimed_twice", "claimed")
	r.TicksEnqueuedTwice = twice(h.Enqueues, func(e TickEvent) bool { return e.Result == "enqueued" || e.Result == "caught_up" },
		"ticks_enqueued_twice", "enqueued fresh")
	r.TicksChecked = len(h.Ticks)
	skipped := map[key]bool{}
	for _, e := range h.Skips {
		skipped[key{e.Schedule, e.Tick}] = true
	}
	for _, t := range h.Ticks {
		if t.State == "" && skipped[key{t.Schedule, t.Tick}] {
			r.TicksSkippedOverlap++
		} else if t.State == "" {
			r.TicksMissing++
			add(Violation{Check: "ticks_missing", At: time.Unix(t.Tick, 0), Detail: fmt.Sprintf(
				"%s tick %d (%s) has no task in asynq", t.Schedule, t.Tick, time.Unix(t.Tick, 0).UTC().Format(time.TimeOnly))})
		}
	}
}

func describeClaims(cs []TickEvent) string {
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += ", "
		}
		s += c.Replica + " (" + c.Kind
		if c.Result != "" {
			s += " " + c.Result
		}
		s += ")"
	}
	return s
}

// perFault counts faults by kind, puts violations down to the faults that
// healed shortly before them, and measures how soon jobs and ticks resumed.
func perFault(h History, r *Report, found []Violation) {
	var oks []time.Time
	for _, e := range h.Executions {
		if e.Outcome == "ok" {
			oks = append(oks, e.Finished)
		}
	}
	slices.SortFunc(oks, time.Time.Compare)
	var ticks []time.Time
	for _, e := range h.Enqueues {
		ticks = append(ticks, e.At)
	}
	slices.SortFunc(ticks, time.Time.Compare)
	next := func(ts []time.Time, after time.Time) (time.Duration, bool) {
		i, _ := slices.BinarySearchFunc(ts, after, time.Time.Compare)
		if i == len(ts) {
			return 0, false
		}
		return ts[i].Sub(after), true
	}

	jobs, tickGaps := map[string][]int64{}, map[string][]int64{}
	for _, f := range h.Faults {
		r.Faults[f.Kind]++
		st := r.PerFault[f.Kind]
		if st == nil {
			st = &FaultStats{}
			r.PerFault[f.Kind] = st
		}
		st.Count++
		for _, v := range found {
			if !v.At.Before(f.Start) && v.At.Before(f.End.Add(attribution)) {
				st.Violations++
			}
		}
		dj, okJ := next(oks, f.End)
		dt, okT := next(ticks, f.End)
		if !okJ || !okT {
			st.Unrecovered++
		}
		if okJ {
			jobs[f.Kind] = append(jobs[f.Kind], dj.Milliseconds())
		}
		if okT {
			tickGaps[f.Kind] = append(tickGaps[f.Kind], dt.Milliseconds())
		}
	}
	for kind, st := range r.PerFault {
		st.JobsResumedMaxMS, st.JobsResumedP50MS = maxAndMedian(jobs[kind])
		st.TicksResumedMaxMS, st.TicksResumedP50MS = maxAndMedian(tickGaps[kind])
	}
}

func maxAndMedian(v []int64) (int64, int64) {
	if len(v) == 0 {
		return -1, -1
	}
	slices.Sort(v)
	return v[len(v)-1], v[len(v)/2]
}

// okRunsBy groups the history's ok executions by key, each group in the
// order they started.
func okRunsBy(h History, key func(Execution) string) map[string][]Execution {
	by := map[string][]Execution{}
	for _, e := range h.Executions {
		if e.Outcome == "ok" {
			by[key(e)] = append(by[key(e)], e)
		}
	}
	for _, runs := range by {
		slices.SortStableFunc(runs, func(a, b Execution) int { return a.Started.Compare(b.Started) })
	}
	return by
}

// runKey is what executions must not overlap on: an order, or one permit of
// a tenant.
func runKey(e Execution) string {
	if e.TenantID != "" {
		return fmt.Sprintf("tenant %s permit %d", e.TenantID, e.Permit)
	}
	return e.OrderID
}

// sickness returns whether a time span touches a Redis fault (paused or
// down, and redisGrace after), when the locks live in Redis.
func sickness(h History) func(a, b time.Time) bool {
	var sick [][2]time.Time
	for _, f := range h.Faults {
		if redisFault(f.Kind) && h.Lock != "etcd" {
			sick = append(sick, [2]time.Time{f.Start, f.End.Add(redisGrace)})
		}
	}
	return func(a, b time.Time) bool {
		for _, w := range sick {
			if a.Before(w[1]) && b.After(w[0]) {
				return true
			}
		}
		return false
	}
}

// checkLimit counts the instants when more ok syncs of one tenant ran at
// once than its limit, apart from those that touch a time when Redis was
// paused or down (as for overlaps).
func checkLimit(h History, add func(Violation)) (over, syncs, most int) {
	touches := sickness(h)
	byTenant := okRunsBy(h, func(e Execution) string { return e.TenantID })
	for _, tenant := range slices.Sorted(maps.Keys(byTenant)) {
		if tenant == "" {
			continue // orders
		}
		syncs += len(byTenant[tenant])
		type edge struct {
			at    time.Time
			delta int
			e     Execution
		}
		var edges []edge
		for _, e := range byTenant[tenant] {
			edges = append(edges, edge{e.Started, 1, e}, edge{e.Finished, -1, e})
		}
		// Ends first at one instant: a permit handed on starts its next run
		// in the millisecond the last one ended.
		slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.delta, b.delta)) })
		var running []Execution
		for _, ed := range edges {
			if ed.delta < 0 {
				running = slices.DeleteFunc(running, func(x Execution) bool { return x == ed.e })
				continue
			}
			running = append(running, ed.e)
			most = max(most, len(running))
			if len(running) <= tenantLimit {
				continue
			}
			sick := false
			for _, x := range running {
				sick = sick || touches(x.Started, x.Finished)
			}
			if !sick {
				over++
				add(Violation{Check: "over_limit", At: ed.at, Detail: fmt.Sprintf(
					"tenant %s: %d syncs at once (limit %d) when task %s (permit %d, fence %d, %s) started",
					tenant, len(running), tenantLimit, ed.e.TaskID, ed.e.Permit, ed.e.Fence, ed.e.Worker)})
			}
		}
	}
	return over, syncs, most
}

// recoveryBound is G7's bound on a killed worker's locked task: back within
// its lock's TTL and this much more.
const recoveryBound = 3 * time.Second

// checkRecoveryTimes measures, for every worker kill, how long each task
// the killed worker was running took to start again (RecoveryMS), and
// counts the producer's jobs of a worker_kill later than the lock TTL +
// recoveryBound (G7: a violation). A task was running on the worker when
// its latest fenced begin before the kill was there, that worker recorded
// no end of it by then, and asynq still had it active right after the kill
// (when that was read); such a task holds its lock (the demo writes under
// it). A run that ended with its end unrecorded (Redis away) is asynq's
// retry's, not the kill's. A task with no later start is jobs_lost's to
// judge, not timed here.
func checkRecoveryTimes(h History, r *Report, add func(Violation)) {
	if !h.WritesAvailable {
		r.NotChecked = append(r.NotChecked, "recovery_ms: the demo store keeps no log of its writes")
		return
	}
	bound := h.LockTTL + recoveryBound
	jobs := map[string]bool{}
	for _, j := range h.Jobs {
		jobs[j.ID] = true
	}
	times := map[string][]int64{}
	for _, f := range h.Faults {
		if f.Worker == "" || (f.Kind != FaultWorkerKill && f.Kind != FaultWorkerKillDrain) {
			continue
		}
		// Each task's latest begin before the kill: the killed worker's,
		// and no end of it there by the kill.
		latest := map[string]Write{}
		for _, w := range h.Writes {
			if w.Op == "begin" && !w.At.After(f.Start) && !w.At.Before(latest[w.TaskID].At) {
				latest[w.TaskID] = w
			}
		}
		running := map[string]bool{}
		for id, w := range latest {
			running[id] = w.Worker == f.Worker
		}
		for _, e := range h.Executions {
			if e.Worker == f.Worker && !e.Finished.After(f.Start) && !e.Finished.Before(latest[e.TaskID].At) {
				running[e.TaskID] = false
			}
		}
		if f.Active != nil {
			// A run that ended without its end recorded (Redis was away
			// when it wrote it) left asynq with the task: retried, not in
			// the killed worker's hands.
			for id := range running {
				running[id] = running[id] && slices.Contains(f.Active, id)
			}
		}
		for id, ran := range running {
			if !ran {
				continue
			}
			var next time.Time
			for _, e := range h.Executions {
				if e.TaskID == id && e.Started.After(f.Start) && (next.IsZero() || e.Started.Before(next)) {
					next = e.Started
				}
			}
			if next.IsZero() {
				continue
			}
			d := next.Sub(f.Start)
			times[f.Kind] = append(times[f.Kind], d.Milliseconds())
			if h.LockTTL > 0 && d > bound && f.Kind == FaultWorkerKill && jobs[id] {
				r.RecoveryOverBound++
				held := "not read"
				if f.Holds != nil {
					held = fmt.Sprint(slices.Contains(f.Holds, id))
				}
				late := fmt.Sprintf("task %s of %s (killed at %s) started again %v after the kill, over the lock TTL %v + %v (in its hold records at the kill: %s)",
					id, f.Worker, f.Start.Format("15:04:05.000"), d.Round(time.Millisecond), h.LockTTL, recoveryBound, held)
				r.RecoveryLate = append(r.RecoveryLate, late)
				add(Violation{Check: "recovery_over_bound", At: next, Detail: late})
			}
		}
	}
	for kind, v := range times {
		m, p50 := maxAndMedian(v)
		r.RecoveryMS[kind] = &Spread{P50: p50, Max: m, Tasks: len(v)}
	}
	if h.LockTTL == 0 {
		r.NotChecked = append(r.NotChecked, "recovery_over_bound: the history does not say the lock TTL")
	}
}

// checkRate bounds the starts of each client's rate-limited calls (G11):
// over any window w of their admissions, at most N·w/Per + Burst. A start
// is checked at its admission's time, on Redis's clock (the limit's): the
// start itself follows by the worker's scheduling (RatedStartLagMaxMS). A
// start that no admission counted is an over-grant of its own. Each start
// opening an over-granted window counts once.
func checkRate(h History, r *Report, add func(Violation)) {
	if !h.RatedComplete {
		r.NotChecked = append(r.NotChecked, "rate_over_grants: the rate-limited calls' stream is incomplete (trimmed or unreadable)")
	}
	lim := ratedLimit
	burst := lim.Burst
	if burst == 0 {
		burst = lim.N
	}
	by := map[string][]RatedStart{}
	for _, s := range h.RatedStarts {
		r.RatedStarts++
		if s.Admitted.IsZero() {
			r.RateOverGrants++
			add(Violation{Check: "rate_over_grants", At: s.Started, Detail: fmt.Sprintf(
				"client %s: task %s started on %s with no admission", s.Client, s.TaskID, s.Worker)})
			continue
		}
		r.RatedStartLagMaxMS = max(r.RatedStartLagMaxMS, s.Started.Sub(s.Admitted).Milliseconds())
		by[s.Client] = append(by[s.Client], s)
	}
	for _, client := range slices.Sorted(maps.Keys(by)) {
		starts := by[client]
		slices.SortFunc(starts, func(a, b RatedStart) int { return a.Admitted.Compare(b.Admitted) })
		for i := range starts {
			for j := i; j < len(starts); j++ {
				w := starts[j].Admitted.Sub(starts[i].Admitted)
				bound := float64(lim.N)*w.Seconds()/lim.Per.Seconds() + float64(burst)
				count := j - i + 1
				r.RatedMaxInWindow = max(r.RatedMaxInWindow, float64(count)/bound)
				// count ≤ N·w/Per + Burst, in integers: (count − Burst)·Per ≤ N·w
				if int64(count-burst)*int64(lim.Per) > int64(lim.N)*int64(w) {
					r.RateOverGrants++
					add(Violation{Check: "rate_over_grants", At: starts[i].Admitted, Detail: fmt.Sprintf(
						"client %s: %d starts admitted within %v from task %s's (bound %.2f: %d per %v, burst %d)",
						client, count, w, starts[i].TaskID, bound, lim.N, lim.Per, burst)})
					break
				}
			}
		}
	}
}
