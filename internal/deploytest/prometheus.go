package deploytest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

const (
	startTimeout = 30 * time.Second // exec until /-/ready
	stopTimeout  = 10 * time.Second // SIGTERM until SIGKILL
)

// Scrape is one scrape job of the generated configuration.
type Scrape struct {
	Job     string
	Targets []string // host:port, scraped at /metrics over http
}

// Options configure StartPrometheus.
type Options struct {
	Scrapes   []Scrape
	RuleFiles []string      // rule files to load (absolute paths)
	Interval  time.Duration // scrape and rule evaluation interval; default 1s
}

// Prometheus is one prometheus server process owned by a test.
type Prometheus struct {
	URL string // http://127.0.0.1:port

	*proctest.Proc
	interval time.Duration
	targets  int
	client   *http.Client
}

// StartPrometheus starts a private prometheus server on a free loopback port
// with a configuration generated from o and its data in a private temporary
// directory, and returns once it is ready. The server is stopped in
// tb.Cleanup. It fails the test, with an install hint, when Debian's
// prometheus is not installed.
func StartPrometheus(tb testing.TB, o Options) *Prometheus {
	tb.Helper()
	bin := proctest.Binary(tb, "prometheus", "--no-install-recommends prometheus")
	dir := proctest.TempDir(tb)
	interval := cmp.Or(o.Interval, time.Second)
	config := filepath.Join(dir, "prometheus.yml")
	if err := writeConfig(config, o, interval); err != nil {
		tb.Fatalf("deploytest: prometheus config: %v", err)
	}
	targets := 0
	for _, s := range o.Scrapes {
		targets += len(s.Targets)
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try a few
		port, err := proctest.FreePort()
		if err != nil {
			tb.Fatalf("deploytest: free port: %v", err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := &Prometheus{
			URL:      "http://" + addr,
			interval: interval,
			targets:  targets,
			client:   &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 10 * time.Second},
		}
		args := []string{
			"--config.file=" + config,
			"--storage.tsdb.path=" + filepath.Join(dir, fmt.Sprintf("data-%d", port)),
			"--web.listen-address=" + addr,
			"--log.level=info",
		}
		p.Proc = proctest.New(tb, proctest.Spec{
			What: "prometheus " + addr, Bin: bin, Args: args,
			Log: filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", port)), Ready: p.waitReady,
		})
		if lastErr = p.Start(); lastErr == nil {
			tb.Cleanup(p.stop)
			return p
		}
	}
	tb.Fatalf("deploytest: start prometheus: %v", lastErr)
	return nil
}

func writeConfig(path string, o Options, interval time.Duration) error {
	d := fmt.Sprintf("%dms", interval.Milliseconds())
	type static struct {
		Targets []string `yaml:"targets"`
	}
	type scrape struct {
		Job    string   `yaml:"job_name"`
		Static []static `yaml:"static_configs"`
	}
	cfg := struct {
		Global  map[string]string `yaml:"global"`
		Rules   []string          `yaml:"rule_files,omitempty"`
		Scrapes []scrape          `yaml:"scrape_configs"`
	}{
		Global: map[string]string{"scrape_interval": d, "scrape_timeout": d, "evaluation_interval": d},
		Rules:  o.RuleFiles,
	}
	for _, s := range o.Scrapes {
		cfg.Scrapes = append(cfg.Scrapes, scrape{Job: s.Job, Static: []static{{Targets: s.Targets}}})
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// waitReady waits for /-/ready (proctest's Ready).
func (p *Prometheus) waitReady(exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var err error
	for {
		select {
		case <-exited:
			return errors.New("exited during start")
		default:
		}
		var req *http.Request
		if req, err = http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/-/ready", nil); err != nil {
			return err
		}
		var resp *http.Response
		if resp, err = p.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/-/ready: %s", resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", startTimeout, err)
		case <-exited:
			return errors.New("exited during start")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the exit (SIGKILL after stopTimeout).
func (p *Prometheus) stop() {
	defer p.client.CloseIdleConnections()
	p.Stop(stopTimeout)
}

// Result is the answer to an instant query.
type Result struct {
	Type   string   // vector, matrix, scalar or string
	Series []Series // a scalar or a string is one Series without labels
}

// Series is one series of a result with its value (the last, for a matrix).
type Series struct {
	Labels map[string]string
	Value  string
}

// Query evaluates expr at the current time through /api/v1/query. A query
// Prometheus rejects or cannot evaluate is an error that carries Prometheus'
// error type and message.
func (p *Prometheus) Query(ctx context.Context, expr string) (*Result, error) {
	var data struct {
		Type   string          `json:"resultType"`
		Result json.RawMessage `json:"result"`
	}
	if err := p.api(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	r := &Result{Type: data.Type}
	switch data.Type {
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return nil, err
		}
		for _, s := range v {
			r.Series = append(r.Series, Series{Labels: s.Metric, Value: fmt.Sprint(s.Value[1])})
		}
	case "matrix":
		var m []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		}
		if err := json.Unmarshal(data.Result, &m); err != nil {
			return nil, err
		}
		for _, s := range m {
			if n := len(s.Values); n > 0 {
				r.Series = append(r.Series, Series{Labels: s.Metric, Value: fmt.Sprint(s.Values[n-1][1])})
			}
		}
	default:
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return nil, err
		}
		r.Series = []Series{{Value: fmt.Sprint(v[1])}}
	}
	return r, nil
}

// ScrapeTarget is an active scrape target.
type ScrapeTarget struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"` // up, down, unknown
	LastError string            `json:"lastError"`
}

// Targets returns the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]ScrapeTarget, error) {
	var data struct {
		Active []ScrapeTarget `json:"activeTargets"`
	}
	err := p.api(ctx, "/api/v1/targets?state=active", nil, &data)
	return data.Active, err
}

// WaitScraped waits until every target is up and has been scraped
// successfully at least n times (n ≥ 2 gives rate() something to work on).
func (p *Prometheus) WaitScraped(tb testing.TB, n int) {
	tb.Helper()
	timeout := time.Duration(n+5)*p.interval + 20*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var state string
	for {
		targets, err := p.Targets(ctx)
		state = fmt.Sprint(err)
		if err == nil {
			state = describeTargets(targets)
			if p.allUp(targets) {
				r, err := p.Query(ctx, fmt.Sprintf("sum_over_time(up[1h]) >= %d", n))
				if err == nil && len(r.Series) == p.targets {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("deploytest: targets not scraped %d times within %v: %s\nprometheus log:\n%s", n, timeout, state, p.LogTail(3000))
		case <-time.After(p.interval / 4):
		}
	}
}

func (p *Prometheus) allUp(targets []ScrapeTarget) bool {
	if len(targets) != p.targets {
		return false
	}
	for _, t := range targets {
		if t.Health != "up" {
			return false
		}
	}
	return true
}

func describeTargets(targets []ScrapeTarget) string {
	var b strings.Builder
	for _, t := range targets {
		fmt.Fprintf(&b, "\n  %s %s %s", t.ScrapeURL, t.Health, t.LastError)
	}
	return b.String()
}

// RuleState is how a loaded rule last evaluated.
type RuleState struct {
	Group     string
	Name      string
	Health    string // ok, err, unknown (not evaluated yet)
	LastError string
}

// Rules waits until every loaded rule has been evaluated at least once and
// returns their states.
func (p *Prometheus) Rules(tb testing.TB) []RuleState {
	tb.Helper()
	timeout := 5*p.interval + 20*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		var data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		err := p.api(ctx, "/api/v1/rules", nil, &data)
		var states []RuleState
		evaluated := err == nil
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				states = append(states, RuleState{Group: g.Name, Name: r.Name, Health: r.Health, LastError: r.LastError})
				evaluated = evaluated && r.Health != "unknown"
			}
		}
		if evaluated {
			return states
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("deploytest: rules not evaluated within %v (last error: %v): %+v", timeout, err, states)
		case <-time.After(p.interval / 4):
		}
	}
}

// api calls an HTTP API endpoint (POST with form, or GET when form is nil)
// and decodes the data of a successful answer into data.
func (p *Prometheus) api(ctx context.Context, path string, form url.Values, data any) error {
	method, body := http.MethodGet, io.Reader(nil)
	if form != nil {
		method, body = http.MethodPost, strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, p.URL+path, body)
	if err != nil {
		return err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// CheckQueries evaluates each query on p and reports, through tb.Errorf, the
// ones Prometheus rejects or fails to evaluate, and the ones that should
// return data (q.Data: panels and variables) but return no series. A series
// whose value is NaN counts as data: histogram_quantile gives NaN over a
// window without observations.
func (p *Prometheus) CheckQueries(tb testing.TB, qs []Query) {
	tb.Helper()
	for _, q := range qs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := p.Query(ctx, q.Expr)
		cancel()
		switch {
		case err != nil:
			tb.Errorf("%s: %v\n  query: %s", q.Source, err, q.Expr)
		case q.Data && len(r.Series) == 0:
			tb.Errorf("%s: no data\n  query: %s", q.Source, q.Expr)
		}
	}
}
