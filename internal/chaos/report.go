package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report file names inside the OUT folder (docs/chaos.md).
const (
	ReportJSON     = "chaos-report.json"
	ReportMarkdown = "chaos-report.md"
)

// WriteReport writes r as OUT/chaos-report.json and OUT/chaos-report.md,
// with the faults of h listed in the markdown and replay the command that
// runs the same schedule again.
func WriteReport(dir string, r *Report, h History, replay string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("chaos: report folder: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ReportJSON), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("chaos: write report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ReportMarkdown), []byte(Markdown(r, h, replay)), 0o644); err != nil {
		return fmt.Errorf("chaos: write report: %w", err)
	}
	return nil
}

// Markdown renders r as the report's markdown.
func Markdown(r *Report, h History, replay string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	count := func(n int) string {
		if n == NotAvailable {
			return "not available"
		}
		return fmt.Sprint(n)
	}
	verdict := "no violations"
	if v := r.Violations(); v > 0 {
		verdict = fmt.Sprintf("**%d violations**", v)
	}
	if len(r.NotChecked) > 0 {
		verdict += fmt.Sprintf("; %d checks not made or incomplete (below)", len(r.NotChecked))
	}
	p("# Chaos report\n\nSeed %d, %s of faults and traffic: %s.\n\nReplay: `%s`\n\n", r.Seed,
		time.Duration(r.DurationSeconds*float64(time.Second)).Round(time.Second), verdict, replay)

	p("## Guarantees\n\n| check | guarantee | count | what was checked |\n|---|---|---:|---|\n")
	p("| `overlaps` | G3 | %s | %d ok executions of %d in all; %d overlaps while Redis was paused or down are not counted (README), nor %d during a failover of the lock's Cluster master whose first run's commit the store accepted before the second's begin |\n",
		count(r.Overlaps), r.Executions["ok"], total(r.Executions), r.OverlapsRedisUnhealthy, r.OverlapsFailover)
	p("| `over_limit` | G3 (permits) | %s | %d ok syncs of tenants (limit %d), at most %d of one tenant at once; two on one permit count in `overlaps` |\n",
		count(r.OverLimit), r.TenantSyncs, tenantLimit, r.TenantMaxAtOnce)
	p("| `rate_over_grants` | G11 | %d | %d starts of rate-limited calls (%d per %v per client, burst %d) at their admission times; the fullest window held %.2f of its bound; a start followed its admission by up to %s |\n",
		r.RateOverGrants, r.RatedStarts, ratedLimit.N, ratedLimit.Per, ratedLimit.Burst, r.RatedMaxInWindow, ms(r.RatedStartLagMaxMS))
	p("| `stale_writes_accepted` | G5 | %s | %d accepted fenced writes |\n", count(r.StaleWritesAccepted), r.WritesChecked)
	if len(r.Failovers) > 0 {
		p("| `lost_holders_not_cancelled` | G4, DESIGN §1 | %s | runs of a failed-over Cluster master's resources, running when it failed, still running when the store accepted the next holder's begin |\n",
			count(r.LostHoldersLate))
	}
	p("| `jobs_lost` | G7 | %s | %d jobs enqueued, %d completed, %d archived, %d unfinished at the end |\n",
		count(r.JobsLost), r.JobsEnqueued, r.JobsCompleted, r.JobsArchived, r.JobsUnfinished)
	p("| `jobs_completed_twice_unexplained` | G8 | %s | %d tasks completed twice after a worker was killed once its handler had returned, or after asynq could not record the completion (asynq delivers at least once: README) |\n",
		count(r.JobsCompletedTwiceUnexplained), r.JobsCompletedTwiceExplained)
	p("| `recovered_from_live_workers` | G7, G8 | %d | %d tasks brought back from a worker judged dead; each must follow a kill, a pause or a cut-off of that worker |\n",
		r.RecoveredFromLive, len(h.Recoveries))
	p("| `recovery_over_bound` | G7 | %d | jobs a worker killed mid-work had begun that started again later than the lock TTL + 3 s after the kill (`recovery_ms` below) |\n",
		r.RecoveryOverBound)
	p("| `ticks_claimed_twice` | G1 | %s | %d claims, %d enqueues logged by the replicas; %d takeovers of unfinished ticks |\n",
		count(r.TicksClaimedTwice), len(h.Claims), len(h.Enqueues), r.TicksTakenOver)
	p("| `ticks_enqueued_twice` | G1 | %s | fresh enqueues of one tick by two replicas |\n", count(r.TicksEnqueuedTwice))
	p("| `ticks_missing` | G2 | %s | %d ticks due in the checked window, each looked up in asynq; %d skipped by their overlap policy |\n\n",
		count(r.TicksMissing), r.TicksChecked, r.TicksSkippedOverlap)

	p("## Faults\n\n| fault | count | violations within 10s | jobs resumed (p50 / max) | ticks resumed (p50 / max) | not recovered |\n|---|---:|---:|---|---|---:|\n")
	for _, kind := range faultKinds {
		st := r.PerFault[kind]
		if st == nil {
			continue
		}
		p("| `%s` | %d | %d | %s / %s | %s / %s | %d |\n", kind, st.Count, st.Violations,
			ms(st.JobsResumedP50MS), ms(st.JobsResumedMaxMS), ms(st.TicksResumedP50MS), ms(st.TicksResumedMaxMS), st.Unrecovered)
	}
	p("\nTimes are from the fault healing (process restarted, resumed, link restored) to the next ok execution and the next tick enqueued.\n\n")
	if len(r.Failovers) > 0 {
		p("## Cluster master faults\n\n| fault | count | replica promoted (p50 / max after the fault) | its locks' jobs began again (p50 / max after the fault) | holders cancelled: of its resources / elsewhere | their jobs resumed after (p50 / max) | not resumed |\n|---|---:|---|---|---|---|---:|\n")
		for _, kind := range ClusterFaults {
			if c := r.Failovers[kind]; c != nil {
				p("| `%s` | %d | %d (%s / %s) | %s / %s | %d / %d | %s / %s | %d |\n", kind, c.Count, c.Promoted, ms(c.PromotedMS.P50), ms(c.PromotedMS.Max),
					ms(c.LocksBackMS.P50), ms(c.LocksBackMS.Max),
					c.HoldersCancelled, c.HoldersCancelledElsewhere, ms(c.ResumedMS.P50), ms(c.ResumedMS.Max), c.NotResumed)
			}
		}
		p("\nHolders cancelled: runs under way when the fault began (their fenced begin accepted, not yet their commit) that never committed, of the master's resources and of the others (every master answers `CLUSTERDOWN` until the promotion); resumed: from the fault to the task's next accepted begin. Its locks' jobs began again: from the fault to the first fenced begin of a run of the master's resources after the promotion.\n\n")
	}
	if len(r.RecoveryMS) > 0 {
		p("## Recovery of a killed worker's tasks\n\n| fault | tasks | p50 | max |\n|---|---:|---|---|\n")
		for _, kind := range AllFaults {
			if s := r.RecoveryMS[kind]; s != nil {
				p("| `%s` | %d | %s | %s |\n", kind, s.Tasks, ms(s.P50), ms(s.Max))
			}
		}
		p("\nFrom the kill to each task the killed worker was running starting again; over the lock TTL + 3 s counts in `recovery_over_bound` (%d).\n\n", r.RecoveryOverBound)
		for _, s := range r.RecoveryLate {
			p("- %s\n", s)
		}
		if len(r.RecoveryLate) > 0 {
			p("\n")
		}
	}

	if len(r.NotChecked) > 0 {
		p("## Not checked or incomplete\n\n")
		for _, s := range r.NotChecked {
			p("- %s\n", s)
		}
		p("\n")
	}
	if len(r.Evidence) > 0 {
		p("## Violations\n\n")
		for _, v := range r.Evidence {
			p("- %s `%s`: %s\n", v.At.Format("15:04:05.000"), v.Check, v.Detail)
		}
		p("\n")
	}
	p("## Fault schedule\n\n| at | fault | target | detail |\n|---|---|---|---|\n")
	for _, f := range h.Faults {
		p("| %s | `%s` | %s | %s |\n", f.Start.Sub(h.Start).Round(time.Millisecond), f.Kind, f.Target, f.Detail)
	}
	return b.String()
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func ms(v int64) string {
	if v < 0 {
		return "none"
	}
	return (time.Duration(v) * time.Millisecond).String()
}
