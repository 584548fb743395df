package deploytest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// TestQueriesOnPrometheus runs every dashboard query and alert expression on
// a real Prometheus that scrapes an in-process metrics server holding every
// Lockstep series (and asynq-shaped queue series): each must parse and
// evaluate, each panel and variable must return data, and every alert rule
// Prometheus loads must evaluate without error.
func TestQueriesOnPrometheus(t *testing.T) {
	t.Parallel()
	reg := metrics.NewRegistry()
	observeAll(metrics.New(reg))
	reg.MustRegister(queueCollector{})
	srv := metrics.NewServer("127.0.0.1:0", reg, nil, nil)
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})

	p := StartPrometheus(t, Options{
		Scrapes:   []Scrape{{Job: "lockstep", Targets: []string{srv.Addr()}}},
		RuleFiles: []string{filepath.Join(Root(t), "deploy", "prometheus", "alerts.yml")},
	})
	p.WaitScraped(t, 3)

	d, rules := loadDeployQueries(t)
	p.CheckQueries(t, append(d.Queries(), rules.Queries()...))
	for _, r := range p.Rules(t) {
		if r.Health != "ok" {
			t.Errorf("rule %s in group %s: health %s: %s", r.Name, r.Group, r.Health, r.LastError)
		}
	}
}

// observeAll creates every series the deploy files may select: each
// documented label value, plus one task type and schedule.
func observeAll(m *metrics.Metrics) {
	for _, r := range []string{metrics.AcquireAcquired, metrics.AcquireBusy, metrics.AcquireError} {
		m.LockAcquire.WithLabelValues(r).Inc()
	}
	m.LockAcquireDuration.Observe(0.002)
	m.PermitWait.Observe(0.004)
	for _, r := range []string{metrics.RenewalRenewed, metrics.RenewalLost, metrics.RenewalError, metrics.RenewalPanic} {
		m.Renewals.WithLabelValues(r).Inc()
	}
	m.RenewalDuration.Observe(0.001)
	m.LocksHeld.Set(3)
	for _, r := range metrics.LostReasons {
		m.LockLost.WithLabelValues(r).Inc()
	}
	m.HandlersUnreturned.Set(1)
	m.OldestHold.Set(12)
	m.LockHeld.Observe(1.5)
	m.JobsProcessed.WithLabelValues("demo:order.pay", "success").Inc()
	m.JobContended.WithLabelValues("demo:order.pay").Inc()
	m.JobsRecovered.WithLabelValues("demo:order.pay").Inc()
	m.RateLimited.WithLabelValues("demo:order.pay").Inc()
	m.FairWaits.WithLabelValues("demo:order.pay").Inc()
	m.RateDelay.Observe(0.2)
	for _, r := range []string{"enqueued", "follower", "duplicate", "missed", "caught_up"} {
		m.SchedulerTicks.WithLabelValues("settle-orders", r).Inc()
	}
	m.SchedulerTickLateness.Observe(0.01)
	m.SchedulerTicksMissed.Inc()
	m.SchedulerLeaderChanges.Inc()
	for _, src := range []string{"file", "runtime"} {
		for _, state := range []string{"running", "paused"} {
			m.SchedulerSchedules.WithLabelValues(src, state).Set(1)
		}
	}
}

// queueCollector exports asynq's queue metric families (asynqQueueMetrics)
// for one queue, as asynq's collector does for each queue it finds in Redis.
type queueCollector struct{}

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (queueCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range asynqQueueMetrics {
		desc := prometheus.NewDesc(f.name, f.help, f.labels, nil)
		vt := prometheus.GaugeValue
		if f.typ == dto.MetricType_COUNTER {
			vt = prometheus.CounterValue
		}
		if len(f.labels) == 2 { // queue, state
			for _, state := range asynqStates {
				ch <- prometheus.MustNewConstMetric(desc, vt, 1, "default", state)
			}
			continue
		}
		if len(f.labels) == 0 {
			ch <- prometheus.MustNewConstMetric(desc, vt, 1)
			continue
		}
		ch <- prometheus.MustNewConstMetric(desc, vt, 1, "default")
	}
}
