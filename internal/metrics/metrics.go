// Package metrics owns every Prometheus collector Lockstep exports and the
// HTTP server that exposes them with /healthz and /readyz.
//
// All parts of a process share one *Metrics, so one registry holds every
// series. The names are contracts, listed in docs/operations.md (the root
// package's docs_test.go checks both ways): dashboards and alert rules in
// deploy/ use exactly these.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Label values used across packages, kept here so a dashboard author can find
// every value a series may carry in one place.
const (
	// lockstep_lock_acquire_total{result}
	AcquireAcquired = "acquired"
	AcquireBusy     = "busy"
	AcquireError    = "error"

	// lockstep_lock_renewals_total{result}
	RenewalRenewed = "renewed"
	RenewalLost    = "lost"  // the token was gone: the lease is over
	RenewalError   = "error" // transport error; retried until the deadline
	RenewalPanic   = "panic" // recovered panic inside a renewal
)

// Every value a label of a Lockstep series can take, where the set is fixed.
// New creates each series at zero, so that a rate or increase sees the first
// event (a series that appears at 1 has no increase to show) and dashboards
// have data from the first scrape.
var (
	AcquireResults = []string{AcquireAcquired, AcquireBusy, AcquireError}
	RenewalResults = []string{RenewalRenewed, RenewalLost, RenewalError, RenewalPanic}
	// LostReasons are the values of lockstep_lock_lost_total{reason}: the
	// lock.Reason values.
	LostReasons = []string{"stolen", "expired", "unreachable", "max_hold", "stalled", "quorum_lost"}
)

// Metrics holds Lockstep's collectors.
type Metrics struct {
	LockAcquire         *prometheus.CounterVec // result
	LockAcquireDuration prometheus.Histogram
	Renewals            *prometheus.CounterVec // result
	RenewalDuration     prometheus.Histogram
	LocksHeld           prometheus.Gauge
	LockLost            *prometheus.CounterVec // reason
	HandlersUnreturned  prometheus.Gauge
	OldestHold          prometheus.Gauge
	LockHeld            prometheus.Histogram
	LockNotices         prometheus.Counter
	PermitWait          prometheus.Histogram

	JobsProcessed *prometheus.CounterVec // type, result
	JobContended  *prometheus.CounterVec // type
	JobsRecovered *prometheus.CounterVec // type
	RateLimited   *prometheus.CounterVec // type
	FairWaits     *prometheus.CounterVec // type
	RateDelay     prometheus.Histogram

	SchedulerTicks         *prometheus.CounterVec // schedule, result
	SchedulerTickLateness  prometheus.Histogram
	SchedulerTicksMissed   prometheus.Counter
	SchedulerLeaderChanges prometheus.Counter
	SchedulerSchedules     *prometheus.GaugeVec // source (file, runtime), state (running, paused)
}

// New creates the collectors and registers them with reg. A nil reg leaves
// them unregistered, which is what code that runs without a metrics endpoint
// (tests, library users) gets by default.
func New(reg prometheus.Registerer) *Metrics {
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	var c collectorSet
	m := &Metrics{
		LockAcquire: c.counterVec("lockstep_lock_acquire_total",
			"Lock acquire attempts by result (acquired, busy, error).", "result"),
		LockAcquireDuration: c.histogram("lockstep_lock_acquire_duration_seconds",
			"Time of one acquire attempt against Redis.", latency),
		Renewals: c.counterVec("lockstep_lock_renewals_total",
			"Lease renewals by result (renewed, lost, error, panic).", "result"),
		RenewalDuration: c.histogram("lockstep_lock_renewal_duration_seconds",
			"Time of one renewal round trip (a batch of leases).", latency),
		LocksHeld: c.gauge("lockstep_locks_held",
			"Leases currently held and renewed by this process."),
		LockLost: c.counterVec("lockstep_lock_lost_total",
			"Leases lost while held, by reason (stolen, expired, unreachable, max_hold, stalled, quorum_lost).", "reason"),
		HandlersUnreturned: c.gauge("lockstep_handlers_unreturned",
			"Holds whose work was cancelled (its lock lost, stalled or held too long) and has not returned yet: a handler that ignores its context."),
		OldestHold: c.gauge("lockstep_lock_oldest_hold_seconds",
			"Age of the oldest hold this process renews (0 when none), updated at each renewal round."),
		LockHeld: c.histogram("lockstep_lock_held_seconds",
			"How long leases were held, from acquire to release or loss.", prometheus.ExponentialBuckets(0.01, 4, 10)),
		LockNotices: c.counter("lockstep_lock_notices_total",
			"Server notices (client tracking) on held keys that no write of this process explained; each makes the watchdog renew those leases at once."),
		PermitWait: c.histogram("lockstep_permit_wait_seconds",
			"How long acquires of a resource with a limit waited in its queue for a permit: parked tasks, from joining the queue to the permit, and waiting tasks and goroutines.",
			prometheus.ExponentialBuckets(0.001, 4, 10)),
		JobsProcessed: c.counterVec("lockstep_jobs_processed_total",
			"Jobs processed by type and result (success, failure, lock_lost, invalid, skipped).", "type", "result"),
		JobContended: c.counterVec("lockstep_job_contended_total",
			"Jobs that found their resource lock busy, by task type.", "type"),
		JobsRecovered: c.counterVec("lockstep_jobs_recovered_total",
			"Locked jobs of a dead worker brought back once their lock had expired, by task type.", "type"),
		RateLimited: c.counterVec("lockstep_rate_limited_total",
			"Tasks found over their rate limit and delayed to the moment they may run (no failure, no attempt used), by task type.", "type"),
		FairWaits: c.counterVec("lockstep_fair_waits_total",
			"Tasks parked to wait for their tenant's fair share (FairBy): seen ahead in their queue or delivered before their turn, by task type.", "type"),
		RateDelay: c.histogram("lockstep_rate_limit_delay_seconds",
			"The delay given to a task over its rate limit: the time until its key admits one.",
			prometheus.ExponentialBuckets(0.001, 4, 10)),
		SchedulerTicks: c.counterVec("lockstep_scheduler_ticks_total",
			"Cron ticks seen by this replica, by schedule and result (enqueued, follower, duplicate, missed, caught_up).", "schedule", "result"),
		SchedulerTickLateness: c.histogram("lockstep_scheduler_tick_lateness_seconds",
			"Enqueue time minus the tick's scheduled time.", []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}),
		SchedulerTicksMissed: c.counter("lockstep_scheduler_ticks_missed_total",
			"Ticks that no replica enqueued in time and the catch-up policy dropped."),
		SchedulerLeaderChanges: c.counter("lockstep_scheduler_leader_changes_total",
			"Ticks this replica won when another replica had won the previous tick of the schedule; summed over replicas, the leader changes."),
		SchedulerSchedules: c.gaugeVec("lockstep_scheduler_schedules",
			"Schedules this replica knows, by source (file, runtime) and state (running, paused).", "source", "state"),
	}
	for vec, values := range map[*prometheus.CounterVec][]string{
		m.LockAcquire: AcquireResults, m.Renewals: RenewalResults, m.LockLost: LostReasons,
	} {
		for _, v := range values {
			vec.WithLabelValues(v)
		}
	}
	if reg != nil {
		reg.MustRegister(c...)
	}
	return m
}

// collectorSet builds collectors and keeps each, so that New registers
// every one it built.
type collectorSet []prometheus.Collector

func keep[C prometheus.Collector](s *collectorSet, c C) C {
	*s = append(*s, c)
	return c
}

func (s *collectorSet) counter(name, help string) prometheus.Counter {
	return keep(s, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func (s *collectorSet) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return keep(s, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func (s *collectorSet) gauge(name, help string) prometheus.Gauge {
	return keep(s, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func (s *collectorSet) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return keep(s, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

func (s *collectorSet) histogram(name, help string, buckets []float64) prometheus.Histogram {
	return keep(s, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// nop backs OrNop: collectors nobody scrapes.
var nop = New(nil)

// OrNop returns m, or a set of unregistered collectors when m is nil.
func OrNop(m *Metrics) *Metrics {
	if m == nil {
		return nop
	}
	return m
}
