package deploytest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Root returns the repository root: the closest directory above the working
// directory (a package directory, under go test) that holds go.mod.
func Root(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("deploytest: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("deploytest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dashboard is the part of a Grafana dashboard JSON that the checks read.
type Dashboard struct {
	UID         string  `json:"uid"`
	Title       string  `json:"title"`
	Panels      []Panel `json:"panels"`
	Annotations struct {
		List []Annotation `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; a row keeps its panels in Panels while collapsed.
type Panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *DatasourceRef `json:"datasource"`
	GridPos    struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Targets []Target `json:"targets"`
	Panels  []Panel  `json:"panels"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string         `json:"refId"`
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat"`
	Datasource   *DatasourceRef `json:"datasource"`
}

// DatasourceRef names a datasource by type and uid.
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Annotation is a dashboard annotation; Prometheus ones have an Expr.
type Annotation struct {
	Name       string         `json:"name"`
	Datasource *DatasourceRef `json:"datasource"`
	Expr       string         `json:"expr"`
}

// Variable is a template variable.
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"` // datasource, query, custom, ...
	Datasource *DatasourceRef  `json:"datasource"`
	RawQuery   json.RawMessage `json:"query"` // a string, or {"query": "..."}
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
}

// Query returns the variable's query text.
func (v Variable) Query() string {
	var s string
	if json.Unmarshal(v.RawQuery, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.RawQuery, &o)
	return o.Query
}

// LoadDashboard reads a dashboard JSON file.
func LoadDashboard(path string) (*Dashboard, error) { return load[Dashboard](path, json.Unmarshal) }

// load reads the file at path and decodes it with unmarshal; a decoding
// error names the file.
func load[T any](path string, unmarshal func([]byte, any) error) (*T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v T
	if err := unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &v, nil
}

// AllPanels returns every panel, rows and the panels of collapsed rows included.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Query is one PromQL expression found in a deploy file.
type Query struct {
	Source string // where it is, e.g. `panel "Locks held" target A`
	Raw    string // as written
	Expr   string // runnable by Prometheus: Grafana variables expanded
	Data   bool   // whether it should return data when its metrics exist (panels and variables)
}

// RateInterval stands in for Grafana's $__rate_interval and the other
// interval variables: at least four scrapes at the scrape intervals tests use.
const RateInterval = "1m"

var labelValues = regexp.MustCompile(`(?s)^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// Queries returns the PromQL of every panel target, every query variable
// (label_values(selector, label) yields its selector) and every Prometheus
// annotation, expanded with Expand.
func (d *Dashboard) Queries() []Query {
	var out []Query
	for _, p := range d.AllPanels() {
		for _, t := range p.Targets {
			out = append(out, Query{
				Source: fmt.Sprintf("panel %q target %s", p.Title, t.RefID),
				Raw:    t.Expr, Expr: d.Expand(t.Expr), Data: true,
			})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Query()
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		} else if inner, ok := strings.CutPrefix(strings.TrimSpace(q), "query_result("); ok {
			q = strings.TrimSuffix(inner, ")")
		}
		out = append(out, Query{Source: fmt.Sprintf("variable %q", v.Name), Raw: v.Query(), Expr: d.Expand(q), Data: true})
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			out = append(out, Query{Source: fmt.Sprintf("annotation %q", a.Name), Raw: a.Expr, Expr: d.Expand(a.Expr)})
		}
	}
	return out
}

var grafanaVar = regexp.MustCompile(`\$\{([a-zA-Z0-9_]+)(?::[a-zA-Z]+)?\}|\$([a-zA-Z0-9_]+)|\[\[([a-zA-Z0-9_]+)\]\]`)

// Expand replaces Grafana's variables in expr: the interval variables by
// RateInterval, each template variable by its "All" value (".*" when it has
// none). Unknown variables are left as they are, so that Prometheus rejects
// the query.
func (d *Dashboard) Expand(expr string) string {
	vars := map[string]string{
		"__rate_interval": RateInterval, "__interval": RateInterval, "__range": RateInterval,
		"__interval_ms": "60000", "__range_s": "60", "__range_ms": "60000",
	}
	for _, v := range d.Templating.List {
		if v.Type != "datasource" {
			vars[v.Name] = cmp.Or(v.AllValue, ".*")
		}
	}
	return grafanaVar.ReplaceAllStringFunc(expr, func(s string) string {
		m := grafanaVar.FindStringSubmatch(s)
		if val, ok := vars[m[1]+m[2]+m[3]]; ok {
			return val
		}
		return s
	})
}

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	} `yaml:"groups"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// Name is the alert or record name.
func (r Rule) Name() string { return r.Alert + r.Record }

// LoadRules reads a rule file.
func LoadRules(path string) (*RuleFile, error) { return load[RuleFile](path, yaml.Unmarshal) }

// Queries returns the expression of every rule.
func (f *RuleFile) Queries() []Query {
	var out []Query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, Query{Source: fmt.Sprintf("rule %q in group %q", r.Name(), g.Name), Raw: r.Expr, Expr: r.Expr})
		}
	}
	return out
}
