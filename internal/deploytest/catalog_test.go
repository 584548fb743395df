package deploytest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/metrics/asynqmetrics"
)

// family is a metric family the deploy files may use.
type family struct {
	name   string
	typ    dto.MetricType
	labels []string
	help   string
	open   bool // any label may be matched (ALERTS carries the alerts' labels)
}

// asynqQueueMetrics are the families of asynqmetrics.QueueCollector, which the
// worker registers (asynq's own names; TestAsynqCatalogMatchesCollector keeps
// this list and the collector in step).
var asynqQueueMetrics = []family{
	{name: "asynq_tasks_enqueued_total", typ: dto.MetricType_GAUGE, labels: []string{"queue", "state"},
		help: "Number of tasks enqueued; broken down by queue and state."},
	{name: "asynq_queue_size", typ: dto.MetricType_GAUGE, labels: []string{"queue"}, help: "Number of tasks in a queue"},
	{name: "asynq_queue_latency_seconds", typ: dto.MetricType_GAUGE, labels: []string{"queue"},
		help: "Number of seconds the oldest pending task is waiting in pending state to be processed."},
	{name: "asynq_queue_memory_usage_approx_bytes", typ: dto.MetricType_GAUGE, labels: []string{"queue"},
		help: "Number of memory used by a given queue (approximated number by sampling)."},
	{name: "asynq_tasks_processed_total", typ: dto.MetricType_COUNTER, labels: []string{"queue"},
		help: "Number of tasks processed (both succeeded and failed); broken down by queue"},
	{name: "asynq_tasks_failed_total", typ: dto.MetricType_COUNTER, labels: []string{"queue"},
		help: "Number of tasks failed; broken down by queue"},
	{name: "asynq_queue_paused_total", typ: dto.MetricType_GAUGE, labels: []string{"queue"}, help: "Number of queues paused"},
	{name: "lockstep_queue_metrics_age_seconds", typ: dto.MetricType_GAUGE,
		help: "Age of the asynq queue figures exported (they are refreshed in the background, so a scrape never waits on Redis); +Inf before the first refresh completed."},
}

// asynqStates are the values of asynq_tasks_enqueued_total{state}.
var asynqStates = []string{"active", "pending", "scheduled", "retry", "archived", "completed"}

// prometheusSeries are series Prometheus makes itself.
var prometheusSeries = []family{
	{name: "up", typ: dto.MetricType_GAUGE},
	{name: "scrape_duration_seconds", typ: dto.MetricType_GAUGE},
	{name: "ALERTS", typ: dto.MetricType_GAUGE, open: true},
}

// targetLabels are the labels Prometheus attaches to every scraped series.
var targetLabels = []string{"job", "instance"}

// catalog maps every series name the deploy files may use to its family:
// what a Lockstep process registers (metrics.NewRegistry plus metrics.New),
// asynq's queue metrics and Prometheus' own series. A histogram's family
// stands behind its _bucket, _sum and _count series.
type catalog map[string]family

func newCatalog(t *testing.T) catalog {
	t.Helper()
	reg := metrics.NewRegistry()
	rec := &recorder{Registerer: reg}
	metrics.New(rec)
	// Labelled collectors export nothing until a child exists: create one each.
	for _, c := range rec.collectors {
		if err := createChild(c); err != nil {
			t.Fatalf("catalog: %v", err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("catalog: gather: %v", err)
	}
	fams := slices.Clone(asynqQueueMetrics)
	fams = append(fams, prometheusSeries...)
	for _, mf := range mfs {
		f := family{name: mf.GetName(), typ: mf.GetType(), help: mf.GetHelp()}
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			f.labels = append(f.labels, lp.GetName())
		}
		fams = append(fams, f)
	}
	c := catalog{}
	for _, f := range fams {
		c[f.name] = f
		switch f.typ {
		case dto.MetricType_HISTOGRAM:
			c[f.name+"_bucket"], c[f.name+"_sum"], c[f.name+"_count"] = f, f, f
		case dto.MetricType_SUMMARY:
			c[f.name+"_sum"], c[f.name+"_count"] = f, f
		}
	}
	return c
}

// lockstepFamilies returns the names of the families metrics.New registers.
func (c catalog) lockstepFamilies() []string {
	var out []string
	for name, f := range c {
		if name == f.name && strings.HasPrefix(name, "lockstep_") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// labelsOf returns the labels series of name may carry.
func (c catalog) labelsOf(name string) []string {
	f := c[name]
	labels := append(slices.Clone(f.labels), targetLabels...)
	switch {
	case f.typ == dto.MetricType_HISTOGRAM && name == f.name+"_bucket":
		labels = append(labels, "le")
	case f.typ == dto.MetricType_SUMMARY && name == f.name:
		labels = append(labels, "quantile")
	}
	return labels
}

// listedValues reads the values of a label from a help text that lists them,
// as metrics.go does: "... by result (acquired, busy, error)."
var listedValues = regexp.MustCompile(`by (?:[a-z_]+ and )?([a-z_]+) \(([a-z_]+(?:, [a-z_]+)*)\)`)

// values returns the label values the family of name documents for label,
// or nil when it does not list them.
func (c catalog) values(name, label string) []string {
	f := c[name]
	if strings.HasPrefix(f.name, "asynq_") && label == "state" {
		return asynqStates
	}
	for _, m := range listedValues.FindAllStringSubmatch(f.help, -1) {
		if m[1] == label {
			return strings.Split(m[2], ", ")
		}
	}
	return nil
}

// recorder is a Registerer that remembers what it registered.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// createChild creates one child of a labelled collector, trying label counts
// until the vector accepts one.
func createChild(c prometheus.Collector) error {
	var get func(...string) error
	switch v := c.(type) {
	case *prometheus.CounterVec:
		get = func(l ...string) error { _, err := v.GetMetricWithLabelValues(l...); return err }
	case *prometheus.GaugeVec:
		get = func(l ...string) error { _, err := v.GetMetricWithLabelValues(l...); return err }
	case *prometheus.HistogramVec:
		get = func(l ...string) error { _, err := v.GetMetricWithLabelValues(l...); return err }
	case *prometheus.SummaryVec:
		get = func(l ...string) error { _, err := v.GetMetricWithLabelValues(l...); return err }
	default:
		return nil
	}
	for n := 1; n <= 10; n++ {
		if get(slices.Repeat([]string{"x"}, n)...) == nil {
			return nil
		}
	}
	return fmt.Errorf("cannot create a child of %T", c)
}

func TestAsynqCatalogMatchesCollector(t *testing.T) {
	t.Parallel()
	descs := make(chan *prometheus.Desc, 16)
	asynqmetrics.NewQueueCollector(nil, nil).Describe(descs)
	close(descs)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var got []string
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		got = append(got, m[1])
	}
	var want []string
	for _, f := range asynqQueueMetrics {
		want = append(want, f.name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("asynqmetrics.QueueCollector exports %v; the catalog lists %v", got, want)
	}
}
