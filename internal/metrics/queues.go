package metrics

import (
	"log/slog"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
)

// QueueInspector is the part of *asynq.Inspector the queue collector reads.
type QueueInspector interface {
	Queues() ([]string, error)
	GetQueueInfo(queue string) (*asynq.QueueInfo, error)
}

// QueueCollector exports asynq's queue state on every scrape, under the
// names of asynq's own x/metrics collector (asynq_queue_size, ...), so
// existing asynq dashboards keep working. That module pins go-redis v8, so
// the few lines are kept here instead.
type QueueCollector struct {
	inspector QueueInspector
	log       *slog.Logger
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
	queueSizeDesc = prometheus.NewDesc("asynq_queue_size",
		"Number of tasks in a queue", []string{"queue"}, nil)
	queueLatencyDesc = prometheus.NewDesc("asynq_queue_latency_seconds",
		"Number of seconds the oldest pending task is waiting in pending state to be processed.", []string{"queue"}, nil)
	queueMemoryDesc = prometheus.NewDesc("asynq_queue_memory_usage_approx_bytes",
		"Number of memory used by a given queue (approximated number by sampling).", []string{"queue"}, nil)
	queueProcessedDesc = prometheus.NewDesc("asynq_tasks_processed_total",
		"Number of tasks processed (both succeeded and failed); broken down by queue", []string{"queue"}, nil)
	queueFailedDesc = prometheus.NewDesc("asynq_tasks_failed_total",
		"Number of tasks failed; broken down by queue", []string{"queue"}, nil)
	queuePausedDesc = prometheus.NewDesc("asynq_queue_paused_total",
		"Number of queues paused", []string{"queue"}, nil)
)

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{queueTasksDesc, queueSizeDesc, queueLatencyDesc,
		queueMemoryDesc, queueProcessedDesc, queueFailedDesc, queuePausedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. When Redis does not answer it
// exports nothing for the queues and logs why: /metrics still answers.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	queues, err := c.inspector.Queues()
	if err != nil {
		c.log.Warn("metrics: cannot list asynq queues", "error", err)
		return
	}
	for _, q := range queues {
		info, err := c.inspector.GetQueueInfo(q)
		if err != nil {
			c.log.Warn("metrics: cannot read asynq queue", "queue", q, "error", err)
			continue
		}
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{q}, labels...)...)
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
		ch <- prometheus.MustNewConstMetric(queueProcessedDesc, prometheus.CounterValue, float64(info.ProcessedTotal), q)
		ch <- prometheus.MustNewConstMetric(queueFailedDesc, prometheus.CounterValue, float64(info.FailedTotal), q)
		paused := 0.0
		if info.Paused {
			paused = 1
		}
		gauge(queuePausedDesc, paused)
	}
}
