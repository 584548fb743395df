// Package asynqmetrics exports asynq's queue state to Prometheus for the
// worker. It is apart from package metrics, which the lock imports, so that
// code that only locks does not link asynq.
package asynqmetrics

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
)

// QueueInspector is the part of *asynq.Inspector the queue collector reads.
type QueueInspector interface {
	Queues() ([]string, error)
	GetQueueInfo(queue string) (*asynq.QueueInfo, error)
}

// QueueCollector exports asynq's queue state under the names of asynq's own
// x/metrics collector (asynq_queue_size, ...), so existing asynq dashboards
// keep working. That module pins go-redis v8, so the few lines are kept here
// instead.
//
// A scrape never waits on Redis for longer than Wait: it starts a refresh in
// the background (one at a time, at most every MinInterval) and exports the
// values of the last refresh that completed, with their age in
// lockstep_queue_metrics_age_seconds. While Redis hangs or is down, /metrics
// so answers at once with the last values known, and the age says how old.
type QueueCollector struct {
	inspector QueueInspector
	log       *slog.Logger
	// Wait bounds how long a scrape waits for a refresh it started; default 300ms.
	Wait time.Duration
	// MinInterval is the least time between two refreshes; default 1s.
	MinInterval time.Duration

	mu        sync.Mutex
	last      []prometheus.Metric // from the last refresh that completed
	at        time.Time           // when that refresh started
	started   time.Time           // when the last refresh started
	refreshed chan struct{}       // closed when the refresh under way ends; nil if none
}

// NewQueueCollector returns a collector reading queues through inspector.
func NewQueueCollector(inspector QueueInspector, log *slog.Logger) *QueueCollector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &QueueCollector{inspector: inspector, log: log}
}

var (
	queueTasksDesc = prometheus.NewDesc("asynq_tasks_enqueued_total",
		"Number of tasks enqueued; broken down by queue and state.", []string{"queue", "state"}, nil)
	queueSizeDesc      = perQueue("asynq_queue_size", "Number of tasks in a queue")
	queueLatencyDesc   = perQueue("asynq_queue_latency_seconds", "Number of seconds the oldest pending task is waiting in pending state to be processed.")
	queueMemoryDesc    = perQueue("asynq_queue_memory_usage_approx_bytes", "Number of memory used by a given queue (approximated number by sampling).")
	queueProcessedDesc = perQueue("asynq_tasks_processed_total", "Number of tasks processed (both succeeded and failed); broken down by queue")
	queueFailedDesc    = perQueue("asynq_tasks_failed_total", "Number of tasks failed; broken down by queue")
	queuePausedDesc    = perQueue("asynq_queue_paused_total", "Number of queues paused")
	queueAgeDesc       = prometheus.NewDesc("lockstep_queue_metrics_age_seconds",
		"Age of the asynq queue figures exported (they are refreshed in the background, so a scrape never waits on Redis); +Inf before the first refresh completed.", nil, nil)
)

// perQueue describes an asynq series labelled by queue alone.
func perQueue(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"queue"}, nil)
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{queueTasksDesc, queueSizeDesc, queueLatencyDesc,
		queueMemoryDesc, queueProcessedDesc, queueFailedDesc, queuePausedDesc, queueAgeDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last refreshed values, after
// waiting at most Wait for a refresh it starts.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	done := c.refreshed
	if done == nil && time.Since(c.started) >= cmp.Or(c.MinInterval, time.Second) {
		done = make(chan struct{})
		c.refreshed, c.started = done, time.Now()
		go c.refresh(done, c.started)
	}
	c.mu.Unlock()
	if done != nil {
		t := time.NewTimer(cmp.Or(c.Wait, 300*time.Millisecond))
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	c.mu.Lock()
	last, at := c.last, c.at
	c.mu.Unlock()
	for _, m := range last {
		ch <- m
	}
	age := math.Inf(1)
	if !at.IsZero() {
		age = time.Since(at).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(queueAgeDesc, prometheus.GaugeValue, age)
}

// refresh reads every queue; when Redis does not answer it keeps the last
// values and logs why.
func (c *QueueCollector) refresh(done chan struct{}, started time.Time) {
	ms, err := c.read()
	c.mu.Lock()
	if err == nil {
		c.last, c.at = ms, started
	}
	c.refreshed = nil
	c.mu.Unlock()
	close(done)
	if err != nil {
		c.log.Warn("metrics: cannot read asynq queues; exporting the last values", "error", err)
	}
}

func (c *QueueCollector) read() ([]prometheus.Metric, error) {
	queues, err := c.inspector.Queues()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	var out []prometheus.Metric
	for _, q := range queues {
		info, err := c.inspector.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("read queue %s: %w", q, err)
		}
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{q}, labels...)...))
		}
		for state, n := range map[string]int{
			"active": info.Active, "pending": info.Pending, "scheduled": info.Scheduled,
			"retry": info.Retry, "archived": info.Archived, "completed": info.Completed,
			"aggregating": info.Aggregating,
		} {
			gauge(queueTasksDesc, float64(n), state)
		}
		gauge(queueSizeDesc, float64(info.Size))
		gauge(queueLatencyDesc, info.Latency.Seconds())
		gauge(queueMemoryDesc, float64(info.MemoryUsage))
		out = append(out,
			prometheus.MustNewConstMetric(queueProcessedDesc, prometheus.CounterValue, float64(info.ProcessedTotal), q),
			prometheus.MustNewConstMetric(queueFailedDesc, prometheus.CounterValue, float64(info.FailedTotal), q))
		paused := 0.0
		if info.Paused {
			paused = 1
		}
		gauge(queuePausedDesc, paused)
	}
	return out, nil
}
