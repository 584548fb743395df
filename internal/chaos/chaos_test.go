package chaos

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// make chaos sets these; go test (and make test) runs the 90-second,
// fixed-seed run with every fault kind.
var (
	flagDuration = flag.Duration("chaos.duration", 90*time.Second, "how long the chaos run injects faults and traffic")
	flagSeed     = flag.Uint64("chaos.seed", 1, "the fault schedule's seed; 0 draws one")
	flagOut      = flag.String("chaos.out", "", "folder for chaos-report.md, chaos-report.json and the logs (default: a temporary folder)")
	flagFaults   = flag.String("chaos.faults", "", "comma-separated fault kinds to draw from (empty: all)")
	flagLock     = flag.String("chaos.lock", "redis", "the workers' lock back end: redis, or etcd (a 3-member etcd cluster; adds the etcd faults)")
	flagStore    = flag.String("chaos.store", "redis", "the demo's fenced store: redis, or postgres (a private PostgreSQL; the checker reads its log table)")
	flagRedis    = flag.String("chaos.redis", "single", "where the queue and the locks live: single (one AOF server), or cluster (3 masters with a replica each; adds the Cluster's faults)")
)

// TestChaos runs the binaries under a seeded fault schedule and fails on any
// violation the history checker finds.
func TestChaos(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	out := *flagOut
	if out == "" {
		out = t.TempDir()
	}
	var faults []string
	if *flagFaults != "" {
		faults = strings.Split(*flagFaults, ",")
	}
	replay := fmt.Sprintf("make chaos DURATION=%s SEED=%d", *flagDuration, seed)
	if *flagLock != "redis" {
		replay += " LOCK=" + *flagLock
	}
	if *flagStore != "redis" {
		replay += " STORE=" + *flagStore
	}
	if *flagRedis != "single" {
		replay += " REDIS=" + *flagRedis
	}
	t.Logf("chaos: %s (report in %s)", replay, out)
	rep, h := Run(t, Config{Duration: *flagDuration, Seed: seed, Out: out, Faults: faults, Progress: os.Stderr, Lock: *flagLock, Store: *flagStore, Redis: *flagRedis})
	if err := WriteReport(out, rep, h, replay); err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos: %d faults %v; %d executions %v; %d jobs enqueued, %d completed; %d ticks checked",
		len(h.Faults), rep.Faults, len(h.Executions), rep.Executions, rep.JobsEnqueued, rep.JobsCompleted, rep.TicksChecked)
	t.Logf("chaos: overlaps %d, stale_writes_accepted %d, jobs_lost %d, jobs_completed_twice_unexplained %d (explained %d), ticks_claimed_twice %d, ticks_enqueued_twice %d, ticks_missing %d, recovered_from_live_workers %d",
		rep.Overlaps, rep.StaleWritesAccepted, rep.JobsLost, rep.JobsCompletedTwiceUnexplained, rep.JobsCompletedTwiceExplained,
		rep.TicksClaimedTwice, rep.TicksEnqueuedTwice, rep.TicksMissing, rep.RecoveredFromLive)
	t.Logf("chaos: rate_over_grants %d of %d rate-limited starts (fullest window %.2f of its bound, start lag up to %d ms)",
		rep.RateOverGrants, rep.RatedStarts, rep.RatedMaxInWindow, rep.RatedStartLagMaxMS)
	t.Logf("chaos: over_limit %d, recovery_over_bound %d, recovery_ms %s", rep.OverLimit, rep.RecoveryOverBound, spreads(rep.RecoveryMS))
	for _, s := range rep.RecoveryLate {
		t.Logf("chaos: recovery_over_bound: %s", s)
	}
	for _, s := range rep.NotChecked {
		t.Logf("chaos: not checked: %s", s)
	}
	if len(h.Faults) == 0 || len(h.Executions) == 0 || rep.TicksChecked == 0 || rep.JobsEnqueued == 0 || rep.RatedStarts == 0 {
		t.Errorf("chaos: the run exercised nothing: %d faults, %d executions, %d ticks, %d jobs, %d rate-limited starts",
			len(h.Faults), len(h.Executions), rep.TicksChecked, rep.JobsEnqueued, rep.RatedStarts)
	}
	if v := rep.Violations(); v > 0 {
		for _, e := range rep.Evidence {
			t.Errorf("%s %s: %s", e.At.Format("15:04:05.000"), e.Check, e.Detail)
		}
		t.Fatalf("chaos: %d violations; replay with %s; logs in %s", v, replay, out)
	}
}

// spreads shows recovery_ms as the report has it: kind {p50, max, tasks}.
func spreads(m map[string]*Spread) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s {p50 %d, max %d, tasks %d} ", k, m[k].P50, m[k].Max, m[k].Tasks)
	}
	return strings.TrimSpace(b.String())
}
