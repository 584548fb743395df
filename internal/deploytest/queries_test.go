package deploytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDeployFilesParse parses every file under deploy/: JSON, and every
// document of every YAML file. Files of other kinds need a test that reads
// them; the list below names the tests.
func TestDeployFilesParse(t *testing.T) {
	root := filepath.Join(Root(t), "deploy")
	checkedElsewhere := map[string]string{
		"Dockerfile":              "TestDockerfile",
		"Dockerfile.dockerignore": "TestDockerfile",
		"redis-acl.conf":          "internal/acltest's TestRolesRunUnderTheirACLUsers",
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch filepath.Ext(p) {
		case ".json":
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Errorf("deploy/%s: %v", rel, err)
			}
		case ".yaml", ".yml":
			dec := yaml.NewDecoder(bytes.NewReader(b))
			for n := 1; ; n++ {
				var v yaml.Node
				if err := dec.Decode(&v); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Errorf("deploy/%s: document %d: %v", rel, n, err)
					break
				}
			}
		default:
			if _, ok := checkedElsewhere[rel]; !ok {
				t.Errorf("deploy/%s: no test reads this kind of file", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func loadDeployQueries(t *testing.T) (*Dashboard, *RuleFile) {
	t.Helper()
	root := Root(t)
	d, err := LoadDashboard(filepath.Join(root, "deploy", "grafana", "lockstep.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := LoadRules(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	return d, r
}

// TestDashboard checks the dashboard's structure: every panel queries the
// Prometheus chosen by the datasource variable, the layout fits, every
// variable used is defined, and every Lockstep metric is on it.
func TestDashboard(t *testing.T) {
	d, _ := loadDeployQueries(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q: want both", d.UID, d.Title)
	}
	var dsVar string
	for _, v := range d.Templating.List {
		switch {
		case v.Type == "datasource" && v.Query() == "prometheus":
			dsVar = "${" + v.Name + "}"
		case v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != dsVar):
			t.Errorf("variable %q: datasource %+v, want uid %q (declared before it)", v.Name, v.Datasource, dsVar)
		}
	}
	if dsVar == "" {
		t.Fatalf("no datasource variable of type prometheus")
	}
	onDatasource := func(ref *DatasourceRef) bool {
		return ref != nil && ref.Type == "prometheus" && ref.UID == dsVar
	}

	ids := map[int]string{}
	var boxes []Panel
	for _, p := range d.AllPanels() {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v does not fit 24 columns", p.Title, g)
		}
		for _, b := range boxes {
			if g.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < g.X+g.W && g.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", b.Title, p.Title)
			}
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if !onDatasource(p.Datasource) || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v with %d targets, want uid %s and queries", p.Title, p.Datasource, len(p.Targets), dsVar)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" || !onDatasource(tg.Datasource) {
				t.Errorf("panel %q target %q: want a unique refId, an expr and datasource uid %s", p.Title, tg.RefID, dsVar)
			}
			refs[tg.RefID] = true
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" && !onDatasource(a.Datasource) {
			t.Errorf("annotation %q: datasource %+v, want uid %s", a.Name, a.Datasource, dsVar)
		}
	}

	leftover := regexp.MustCompile(`\$\{?\w+|\[\[\w+\]\]`)
	for _, q := range d.Queries() {
		if m := leftover.FindString(q.Expr); m != "" {
			t.Errorf("%s: undefined variable %s in %s", q.Source, m, q.Raw)
		}
	}

	// Every Lockstep metric has a panel, and so do asynq's queue size and latency.
	cat := newCatalog(t)
	used := map[string]bool{} // families
	for name := range usedMetrics(t, d.Queries()) {
		used[cat[name].name] = true
	}
	want := append(cat.lockstepFamilies(), "asynq_queue_size", "asynq_queue_latency_seconds")
	for _, name := range want {
		if !used[name] {
			t.Errorf("no panel shows %s", name)
		}
	}
}

// TestAlertRules checks what promtool does not: each alert has a severity, a
// summary and a description, the rules watch what issue 6 asks for, and
// alerts_test.yml makes each alert fire at least once.
func TestAlertRules(t *testing.T) {
	_, rules := loadDeployQueries(t)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want summary and description annotations", r.Alert)
			}
		}
	}
	used := usedMetrics(t, rules.Queries())
	for _, name := range []string{
		"lockstep_lock_renewals_total",                    // renewal failures
		"lockstep_lock_lost_total",                        // lost locks
		"lockstep_scheduler_ticks_missed_total",           // missed ticks
		"lockstep_scheduler_ticks_total",                  // no replica claiming ticks
		"lockstep_scheduler_tick_lateness_seconds_bucket", // tick lateness
		"asynq_queue_latency_seconds",                     // queue latency
	} {
		if !used[name] {
			t.Errorf("no alert watches %s", name)
		}
	}

	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, filepath.Join(Root(t), "deploy", "prometheus", "alerts_test.yml"), &tests)
	fired := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fired[a.Alertname] = true
			}
		}
	}
	for _, a := range alerts {
		if !fired[a] {
			t.Errorf("alerts_test.yml never expects %s to fire", a)
		}
	}
}

// TestMetricNames checks every metric, label and label value that the
// dashboard and the alert rules use against the code: what metrics.New
// registers (with the label values its help texts list), asynq's queue
// metrics, and Prometheus' own series.
func TestMetricNames(t *testing.T) {
	cat := newCatalog(t)
	d, rules := loadDeployQueries(t)
	for _, q := range append(d.Queries(), rules.Queries()...) {
		p, err := parsePromQL(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Source, err)
			continue
		}
		var exprLabels []string // labels any series of the expression may carry
		for _, s := range p.selectors {
			f, ok := cat[s.name]
			if !ok {
				t.Errorf("%s: unknown metric %q", q.Source, s.name)
				continue
			}
			labels := cat.labelsOf(s.name)
			exprLabels = append(exprLabels, labels...)
			for _, m := range s.matchers {
				if m.label == "__name__" || f.open {
					continue
				}
				if !slices.Contains(labels, m.label) {
					t.Errorf("%s: %s has no label %q (labels: %v)", q.Source, s.name, m.label, labels)
					continue
				}
				if values := cat.values(s.name, m.label); values != nil {
					for _, v := range literalValues(m) {
						if !slices.Contains(values, v) {
							t.Errorf("%s: %s{%s} is never %q (values: %v)", q.Source, s.name, m.label, v, values)
						}
					}
				}
			}
		}
		for _, l := range p.grouping {
			if !slices.Contains(exprLabels, l) && !slices.ContainsFunc(p.selectors, func(s selector) bool { return cat[s.name].open }) {
				t.Errorf("%s: groups by %q, which none of its series carries", q.Source, l)
			}
		}
	}
}

var literalAlternatives = regexp.MustCompile(`^[a-zA-Z0-9_:.-]+(\|[a-zA-Z0-9_:.-]+)*$`)

// literalValues returns the values a matcher names literally: the value of
// = and !=, the alternatives of a regexp like "a|b"; nil for other regexps.
func literalValues(m matcher) []string {
	switch m.op {
	case "=", "!=":
		return []string{m.value}
	case "=~", "!~":
		if literalAlternatives.MatchString(m.value) {
			return strings.Split(m.value, "|")
		}
	}
	return nil
}

// usedMetrics returns the names of the metrics the queries select.
func usedMetrics(t *testing.T, qs []Query) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for _, q := range qs {
		p, err := parsePromQL(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Source, err)
			continue
		}
		for _, s := range p.selectors {
			used[s.name] = true
		}
	}
	return used
}
