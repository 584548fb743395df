// Package metrics owns every Prometheus collector Lockstep exports and the
// HTTP server that exposes them with /healthz and /readyz.
//
// All parts of a process share one *Metrics, so one registry holds every
// series. The names are contracts (docs/design.md section 9): dashboards and alert
// rules in deploy/ use exactly these.
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
	LostReasons = []string{"stolen", "expired", "unreachable", "max_hold", "quorum_lost"}
)

// Metrics holds Lockstep's collectors.
type Metrics struct {
	LockAcquire         *prometheus.CounterVec // result
	LockAcquireDuration prometheus.Histogram
	Renewals            *prometheus.CounterVec // result
	RenewalDuration     prometheus.Histogram
	LocksHeld           prometheus.Gauge
	LockLost            *prometheus.CounterVec // reason
	LockHeld            prometheus.Histogram
	LockNotices         prometheus.Counter

	JobsProcessed *prometheus.CounterVec // type, result
	JobContended  *prometheus.CounterVec // type

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
	m := &Metrics{
		LockAcquire: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_lock_acquire_total",
			Help: "Lock acquire attempts by result (acquired, busy, error).",
		}, []string{"result"}),
		LockAcquireDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockstep_lock_acquire_duration_seconds",
			Help:    "Time of one acquire attempt against Redis.",
			Buckets: latency,
		}),
		Renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_lock_renewals_total",
			Help: "Lease renewals by result (renewed, lost, error, panic).",
		}, []string{"result"}),
		RenewalDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockstep_lock_renewal_duration_seconds",
			Help:    "Time of one renewal round trip (a batch of leases).",
			Buckets: latency,
		}),
		LocksHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockstep_locks_held",
			Help: "Leases currently held and renewed by this process.",
		}),
		LockLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_lock_lost_total",
			Help: "Leases lost while held, by reason (stolen, expired, unreachable, max_hold, quorum_lost).",
		}, []string{"reason"}),
		LockHeld: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockstep_lock_held_seconds",
			Help:    "How long leases were held, from acquire to release or loss.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}),
		LockNotices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockstep_lock_notices_total",
			Help: "Server notices (client tracking) on held keys that no write of this process explained; each makes the watchdog renew those leases at once.",
		}),
		JobsProcessed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_jobs_processed_total",
			Help: "Jobs processed by type and result (success, failure, lock_lost, invalid, skipped).",
		}, []string{"type", "result"}),
		JobContended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_job_contended_total",
			Help: "Jobs that found their resource lock busy, by task type.",
		}, []string{"type"}),
		SchedulerTicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockstep_scheduler_ticks_total",
			Help: "Cron ticks seen by this replica, by schedule and result (enqueued, follower, duplicate, missed, caught_up).",
		}, []string{"schedule", "result"}),
		SchedulerTickLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockstep_scheduler_tick_lateness_seconds",
			Help:    "Enqueue time minus the tick's scheduled time.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		SchedulerTicksMissed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockstep_scheduler_ticks_missed_total",
			Help: "Ticks that no replica enqueued in time and the catch-up policy dropped.",
		}),
		SchedulerLeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockstep_scheduler_leader_changes_total",
			Help: "Ticks this replica won when another replica had won the previous tick of the schedule; summed over replicas, the leader changes.",
		}),
		SchedulerSchedules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockstep_scheduler_schedules",
			Help: "Schedules this replica knows, by source (file, runtime) and state (running, paused).",
		}, []string{"source", "state"}),
	}
	for _, r := range AcquireResults {
		m.LockAcquire.WithLabelValues(r)
	}
	for _, r := range RenewalResults {
		m.Renewals.WithLabelValues(r)
	}
	for _, r := range LostReasons {
		m.LockLost.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(
			m.LockAcquire, m.LockAcquireDuration, m.Renewals, m.RenewalDuration,
			m.LocksHeld, m.LockLost, m.LockHeld, m.LockNotices, m.JobsProcessed, m.JobContended,
			m.SchedulerTicks, m.SchedulerTickLateness, m.SchedulerTicksMissed,
			m.SchedulerLeaderChanges, m.SchedulerSchedules,
		)
	}
	return m
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
