package lockstep_test

import (
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/metrics/asynqmetrics"
)

// docFiles are the user documentation that the checks below hold to the code.
func docFiles(t *testing.T) []string {
	t.Helper()
	return glob(t, "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/*.md")
}

var fence = regexp.MustCompile("(?s)```.*?```")

// prose is a Markdown file without its fenced blocks.
func prose(md string) string { return fence.ReplaceAllString(md, "") }

// TestDocsLinksResolve: every relative link and #anchor in the docs points
// at a file that exists and a heading it has, by GitHub's anchor rules.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, f := range docFiles(t) {
		for _, m := range link.FindAllStringSubmatch(prose(read(t, f)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			file := f
			if path != "" {
				file = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s links to %s, which does not exist", f, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				t.Errorf("%s links to %s: an anchor in a file that is not Markdown", f, target)
				continue
			}
			if !slices.Contains(anchors(read(t, file)), anchor) {
				t.Errorf("%s links to %s: %s has no heading with anchor #%s (it has %v)", f, target, file, anchor, anchors(read(t, file)))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d links; the pattern no longer matches them", checked)
	}
}

// anchors are the ids GitHub gives a Markdown file's headings: lower case,
// punctuation dropped, spaces as hyphens, repeats numbered -1, -2, ...
func anchors(md string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range strings.Split(prose(md), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", id, n))
		} else {
			out = append(out, id)
		}
		seen[id]++
	}
	return out
}

func TestAnchorsFollowGitHub(t *testing.T) {
	t.Parallel()
	got := anchors("# A\n## Proof under faults: `make chaos`\n## 5. Watchdog\n## A dead worker's jobs\n```\n# not a heading\n```\n## A\n")
	want := []string{"a", "proof-under-faults-make-chaos", "5-watchdog", "a-dead-workers-jobs", "a-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("anchors = %v, want %v", got, want)
	}
}

// TestConfigurationDocumentsEveryKey: docs/configuration.md has one row per
// config key, the key exists in the config structs, and its default is the
// one the code applies.
func TestConfigurationDocumentsEveryKey(t *testing.T) {
	t.Parallel()
	row := regexp.MustCompile("(?m)^\\| `([a-z_.\\[\\]]+)` \\| ([^|]*) \\|")
	documented := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(read(t, "docs/configuration.md"), -1) {
		if _, dup := documented[m[1]]; dup {
			t.Errorf("docs/configuration.md documents %s twice", m[1])
		}
		documented[m[1]] = m[2]
	}
	defaults := map[string][]string{} // key -> the default of each config that has it
	keys(reflect.ValueOf(*config.DefaultWorker()), "", defaults)
	keys(reflect.ValueOf(*config.DefaultScheduler()), "", defaults)
	keys(reflect.ValueOf(defaultSchedule(t)), "schedules[].", defaults)
	delete(defaults, "schedules")
	for key, values := range defaults {
		cell, ok := documented[key]
		if !ok {
			t.Errorf("config key %s is not documented in docs/configuration.md", key)
			continue
		}
		for _, v := range values {
			if !strings.Contains(cell, "`"+v+"`") {
				t.Errorf("docs/configuration.md: %s's default is `%s`; the row says %q", key, v, strings.TrimSpace(cell))
			}
		}
	}
	for key := range documented {
		if _, ok := defaults[key]; !ok {
			t.Errorf("docs/configuration.md documents %s, which no config struct has", key)
		}
	}
	if len(documented) < 40 {
		t.Fatalf("found %d keys in docs/configuration.md; the pattern no longer matches them", len(documented))
	}
}

// defaultSchedule is a schedule as the scheduler loads it with only its
// required fields set.
func defaultSchedule(t *testing.T) config.Schedule {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	yaml := "redis:\n  addr: 127.0.0.1:6379\nschedules:\n  - name: s\n    cron: \"@every 1m\"\n    task: t\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadScheduler(path, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	s := c.Schedules[0]
	s.Name, s.Cron, s.Task = "", "", ""
	return s
}

// keys walks a config struct by its yaml tags and records each leaf key
// with its value as the docs write it.
func keys(v reflect.Value, prefix string, out map[string][]string) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fv := v.Field(i)
		if tag == "" && f.Anonymous {
			keys(fv, prefix, out)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		if fv.Kind() == reflect.Struct {
			keys(fv, key+".", out)
			continue
		}
		s := format(fv)
		if !slices.Contains(out[key], s) {
			out[key] = append(out[key], s)
		}
	}
}

func format(v reflect.Value) string {
	if d, ok := v.Interface().(time.Duration); ok {
		s := d.String() // 24h0m0s, written 24h
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
	if raw, ok := v.Interface().(json.RawMessage); ok {
		if len(raw) == 0 {
			return "null"
		}
		return string(raw)
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return v.String()
	case reflect.Slice:
		if v.Len() == 0 {
			return "[]"
		}
	case reflect.Map:
		var kv []string
		for _, k := range v.MapKeys() {
			kv = append(kv, fmt.Sprintf("%v: %v", k, v.MapIndex(k)))
		}
		sort.Strings(kv)
		return "{" + strings.Join(kv, ", ") + "}"
	}
	return fmt.Sprint(v.Interface())
}

// TestMetricsAreDocumented: every metric a binary registers has a row in
// docs/operations.md, and every metric any doc names is registered.
func TestMetricsAreDocumented(t *testing.T) {
	t.Parallel()
	var reg collectors
	metrics.New(&reg)
	reg.MustRegister(asynqmetrics.NewQueueCollector(nil, nil))
	registered := map[string]bool{}
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range reg {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			registered[name.FindStringSubmatch(d.String())[1]] = true
		}
	}
	metric := regexp.MustCompile("`((?:lockstep|asynq)_[a-z_]+)(?:\\{[^`]*\\})?`")
	inOperations := map[string]bool{}
	for _, f := range docFiles(t) {
		// SQL blocks quote identifiers with backquotes (MySQL): a table
		// named lockstep_... there is not a metric.
		text := regexp.MustCompile("(?s)```sql\n.*?```").ReplaceAllString(read(t, f), "")
		for _, m := range metric.FindAllStringSubmatch(text, -1) {
			if !registered[m[1]] {
				t.Errorf("%s names the metric %s, which no collector registers", f, m[1])
			}
			if f == filepath.Join("docs", "operations.md") {
				inOperations[m[1]] = true
			}
		}
	}
	for n := range registered {
		if !inOperations[n] {
			t.Errorf("metric %s is registered but not documented in docs/operations.md", n)
		}
	}
	if len(registered) < 20 {
		t.Fatalf("found %d registered metrics; the capture no longer sees them", len(registered))
	}
}

// collectors is a Registerer that keeps what is registered.
type collectors []prometheus.Collector

func (c *collectors) Register(x prometheus.Collector) error   { *c = append(*c, x); return nil }
func (c *collectors) MustRegister(xs ...prometheus.Collector) { *c = append(*c, xs...) }
func (c *collectors) Unregister(prometheus.Collector) bool    { return false }

// TestCommentsNameExistingFiles: a comment that names a file (a path, or a
// file name of the repository) names one that exists.
func TestCommentsNameExistingFiles(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	tracked := strings.Fields(string(out))
	exists := func(dir, name string) bool {
		for _, p := range []string{filepath.Join(dir, name), name} {
			if _, err := os.Stat(p); err == nil {
				return true
			}
		}
		for _, p := range tracked {
			if strings.HasSuffix(p, "/"+name) {
				return true
			}
		}
		return false
	}
	file := regexp.MustCompile(`(?:^|[\s(“"'` + "`" + `])((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+(?:_test)?\.(?:go|md|lua|yaml|yml|sh))\b`)
	placeholder := regexp.MustCompile(`^[A-Z]+/`)
	checked := 0
	for _, path := range tracked {
		if !strings.HasSuffix(path, ".go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range f.Comments {
			for _, m := range file.FindAllStringSubmatch(g.Text(), -1) {
				if placeholder.MatchString(m[1]) {
					continue // OUT/chaos-report.md: a file the program writes
				}
				checked++
				if !exists(filepath.Dir(path), m[1]) {
					t.Errorf("%s: a comment names %s, which is not in the repository", path, m[1])
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d file names in comments; the pattern no longer matches them", checked)
	}
}

// TestREADMEIsShortAndHoldsTheOnlyGuarantees: the README stays within 200
// lines, and its guarantees table (G1 to G9) is the only copy in the docs.
func TestREADMEIsShortAndHoldsTheOnlyGuarantees(t *testing.T) {
	t.Parallel()
	readme := read(t, "README.md")
	if n := strings.Count(readme, "\n"); n > 200 {
		t.Errorf("README.md has %d lines; at most 200", n)
	}
	row := regexp.MustCompile(`(?m)^\| G[1-9] \|`)
	if n := len(row.FindAllString(readme, -1)); n != 9 {
		t.Errorf("README.md has %d rows G1..G9 in its guarantees table, want 9", n)
	}
	for _, f := range docFiles(t) {
		if f != "README.md" && row.MatchString(read(t, f)) {
			t.Errorf("%s copies a row of the guarantees table; link to README.md#what-it-guarantees instead", f)
		}
	}
}
