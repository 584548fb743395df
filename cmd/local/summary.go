package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// source is one role's metrics: a scheduler's registry, read directly, or a
// worker's /metrics, scraped.
type source struct {
	name   string
	gather func(ctx context.Context) ([]*dto.MetricFamily, error)
}

func registrySource(name string, r *registry) source {
	return source{name: name, gather: func(context.Context) ([]*dto.MetricFamily, error) { return r.Gather() }}
}

func scrapeSource(w *roleProc, hc *http.Client) source {
	url := w.metricsURL()
	return source{name: w.name, gather: func(ctx context.Context) ([]*dto.MetricFamily, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "text/plain") // the text format, which expfmt parses below
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
			return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", url, err)
		}
		out := make([]*dto.MetricFamily, 0, len(fams))
		for _, f := range fams {
			out = append(out, f)
		}
		return out, nil
	}}
}

// family is one role's series of one metric.
type family []*dto.Metric

// sum adds the values of the series whose labels include match (name,
// value pairs).
func (f family) sum(match ...string) float64 {
	var total float64
	for _, m := range f {
		if !hasLabels(m, match) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		}
	}
	return total
}

func hasLabels(m *dto.Metric, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == match[i] && l.GetValue() == match[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func byName(fams []*dto.MetricFamily) map[string]family {
	out := make(map[string]family, len(fams))
	for _, f := range fams {
		out[f.GetName()] = f.GetMetric()
	}
	return out
}

// count is a number attributed to one role.
type count struct {
	role string
	n    int
}

// snapshot is what the roles' metrics say at one moment.
type snapshot struct {
	enqueued   []count // per scheduler replica: ticks it enqueued (on time or caught up)
	duplicate  int     // ticks a replica won whose task id existed already
	missed     int
	jobsOK     []count // per worker: demo jobs that succeeded
	jobsFailed int     // failed or lock lost
	contended  int     // requeues because the lock was busy
	locksHeld  int
	renewed    int
	renewFail  int            // renewals that errored or panicked
	lost       map[string]int // lost locks by reason
	queue      map[string]int // asynq tasks of the default queue by state
	errs       []string       // roles whose metrics could not be read
}

func total(cs []count) int {
	n := 0
	for _, c := range cs {
		n += c.n
	}
	return n
}

func (s snapshot) lostTotal() int {
	n := 0
	for _, v := range s.lost {
		n += v
	}
	return n
}

// collect reads every role's metrics. A role that does not answer is named
// in errs and counts as zero.
func collect(ctx context.Context, schedulers, workers []source) snapshot {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s := snapshot{lost: map[string]int{}, queue: map[string]int{}}
	for _, src := range schedulers {
		fams, err := src.gather(ctx)
		if err != nil {
			s.errs = append(s.errs, src.name+": "+err.Error())
		}
		f := byName(fams)["lockstep_scheduler_ticks_total"]
		s.enqueued = append(s.enqueued, count{src.name,
			int(f.sum("result", scheduler.ResultEnqueued) + f.sum("result", scheduler.ResultCaughtUp))})
		s.duplicate += int(f.sum("result", scheduler.ResultDuplicate))
		s.missed += int(f.sum("result", scheduler.ResultMissed))
	}
	queueRead := false
	for _, src := range workers {
		fams, err := src.gather(ctx)
		if err != nil {
			s.errs = append(s.errs, src.name+": "+err.Error())
		}
		m := byName(fams)
		jp := m["lockstep_jobs_processed_total"]
		s.jobsOK = append(s.jobsOK, count{src.name, int(jp.sum("result", jobs.ResultSuccess))})
		s.jobsFailed += int(jp.sum("result", jobs.ResultFailure) + jp.sum("result", jobs.ResultLockLost))
		s.contended += int(m["lockstep_job_contended_total"].sum())
		s.locksHeld += int(m["lockstep_locks_held"].sum())
		r := m["lockstep_lock_renewals_total"]
		s.renewed += int(r.sum("result", metrics.RenewalRenewed))
		s.renewFail += int(r.sum("result", metrics.RenewalError) + r.sum("result", metrics.RenewalPanic))
		for _, reason := range metrics.LostReasons {
			s.lost[reason] += int(m["lockstep_lock_lost_total"].sum("reason", reason))
		}
		// Every worker exports the same queue state; one is enough.
		if q, ok := m["asynq_tasks_enqueued_total"]; ok && !queueRead {
			queueRead = true
			for _, state := range []string{"pending", "active", "retry", "scheduled"} {
				s.queue[state] = int(q.sum("queue", demo.Queue, "state", state))
			}
		}
	}
	return s
}

// executions follows the demo stream from the run's start: outcomes, and
// the records that break a guarantee.
type executions struct {
	client     redis.UniversalClient
	stream     string
	last       string           // id of the last record read
	outcomes   map[string]int   // outcome -> records
	okTasks    map[string]int   // task id -> ok records
	lastEnd    map[string]int64 // order -> finished_ms of its latest held execution
	lastFence  map[string]int64 // order -> fence of its latest held execution
	violations []string
}

func newExecutions(c redis.UniversalClient, stream, fromID string) *executions {
	return &executions{
		client: c, stream: stream, last: fromID,
		outcomes: map[string]int{}, okTasks: map[string]int{},
		lastEnd: map[string]int64{}, lastFence: map[string]int64{},
	}
}

// read takes in every record added since the last read.
func (x *executions) read(ctx context.Context) error {
	for {
		res, err := x.client.XRead(ctx, &redis.XReadArgs{
			Streams: []string{x.stream, x.last},
			Count:   1000,
			Block:   -1, // no BLOCK: answer at once
		}).Result()
		if errors.Is(err, redis.Nil) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", x.stream, err)
		}
		n := 0
		for _, st := range res {
			for _, msg := range st.Messages {
				x.add(msg)
				x.last = msg.ID
				n++
			}
		}
		if n < 1000 {
			return nil
		}
	}
}

// add checks one record against the ones before it.
//
// A worker writes the record while it holds the order's lock (only a
// lock_lost record may be written after the lock passed on), so the held
// records of one order come in the order of their holds: each started after
// the previous one ended, with a higher fence. A tenant's syncs
// (demo:tenant.sync, limit 3) are held per permit: the same holds per
// (tenant, permit), and the permit is below the limit.
func (x *executions) add(msg redis.XMessage) {
	field := func(k string) string { s, _ := msg.Values[k].(string); return s }
	order, outcome, task := "order "+field("order_id"), field("outcome"), field("task_id")
	if tenant := field("tenant_id"); tenant != "" {
		order = "tenant " + tenant + " permit " + field("permit")
		if p, err := strconv.Atoi(field("permit")); err != nil || p < 0 || p >= demo.TenantLimit {
			x.violations = append(x.violations, fmt.Sprintf("%s: task %s held a permit outside 0 to %d", order, task, demo.TenantLimit-1))
		}
	}
	started, _ := strconv.ParseInt(field("started_ms"), 10, 64)
	finished, _ := strconv.ParseInt(field("finished_ms"), 10, 64)
	fence, _ := strconv.ParseInt(field("fence"), 10, 64)
	x.outcomes[outcome]++
	if outcome == demo.OutcomeOK {
		if x.okTasks[task]++; x.okTasks[task] == 2 {
			x.violations = append(x.violations, fmt.Sprintf("task %s ran to success twice", task))
		}
	}
	if outcome == demo.OutcomeLockLost {
		return
	}
	if end, ok := x.lastEnd[order]; ok && started < end {
		x.violations = append(x.violations, fmt.Sprintf(
			"%s: task %s started at %d ms, before the previous execution ended at %d ms", order, task, started, end))
	}
	if f, ok := x.lastFence[order]; ok && fence <= f {
		x.violations = append(x.violations, fmt.Sprintf(
			"%s: task %s ran with fence %d, not above the previous execution's %d", order, task, fence, f))
	}
	x.lastEnd[order] = max(x.lastEnd[order], finished)
	x.lastFence[order] = max(x.lastFence[order], fence)
}

func (x *executions) ok() int { return x.outcomes[demo.OutcomeOK] }

// line is one summary line.
func line(elapsed time.Duration, s snapshot, x *executions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%6s] ticks %d enqueued (%s), %d missed, %d duplicate", elapsed.Round(time.Second),
		total(s.enqueued), counts(s.enqueued), s.missed, s.duplicate)
	fmt.Fprintf(&b, " | jobs %d done (%s), %d failed, %d requeued on contention",
		total(s.jobsOK), counts(s.jobsOK), s.jobsFailed, s.contended)
	fmt.Fprintf(&b, " | locks %d held, %d renewals", s.locksHeld, s.renewed)
	if s.renewFail > 0 {
		fmt.Fprintf(&b, " (%d failed)", s.renewFail)
	}
	fmt.Fprintf(&b, ", %d lost", s.lostTotal())
	if n := s.lostTotal(); n > 0 {
		var rs []string
		for _, r := range metrics.LostReasons {
			if s.lost[r] > 0 {
				rs = append(rs, fmt.Sprintf("%s %d", r, s.lost[r]))
			}
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(rs, ", "))
	}
	fmt.Fprintf(&b, " | fence rejections %d", x.outcomes[demo.OutcomeFenceRejected])
	if len(s.queue) > 0 {
		fmt.Fprintf(&b, " | queue %d pending, %d running, %d waiting to retry",
			s.queue["pending"], s.queue["active"], s.queue["retry"]+s.queue["scheduled"])
	}
	if len(s.errs) > 0 {
		slices.Sort(s.errs)
		fmt.Fprintf(&b, " | metrics unreadable: %s", strings.Join(s.errs, "; "))
	}
	return b.String()
}

func counts(cs []count) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s %d", c.role, c.n)
	}
	return strings.Join(parts, ", ")
}
