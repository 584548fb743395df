// Package jaegertest starts a private Jaeger for tests, the way redistest
// starts Redis: the all-in-one binary with in-memory storage, its OTLP/HTTP
// receiver and its query API on free loopback ports, from a configuration of
// the test's own, killed in t.Cleanup. A test points the OTEL_* variables of
// the processes it runs at OTLPEndpoint and reads what arrived through the
// query API (Traces, Trace), the one Jaeger's UI reads. Nothing here mocks
// a collector.
//
// The binary is not a Debian package: scripts/deps.sh (make deps, make test)
// builds Jaeger Version from source once per machine into BinaryPath, where
// Start finds it; it builds in the background at low priority, and Start
// waits while that build is under way. When it is missing and no build is,
// Start fails the test saying how to build it; it never skips.
package jaegertest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// Version is the Jaeger release the tests run: the one scripts/deps.sh
// builds (keep the two equal).
const Version = "v1.75.0"

// startTimeout bounds how long Jaeger may take to serve both its ports.
const startTimeout = 30 * time.Second

// BinaryPath is where scripts/deps.sh puts the Jaeger binary:
// jaeger-<Version>/jaeger under lockstep's directory of the user's cache
// ($XDG_CACHE_HOME, else ~/.cache), which outlives test runs.
func BinaryPath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "lockstep", "jaeger-"+Version, "jaeger"), nil
}

// buildWait bounds how long a test waits for a build of Jaeger under way:
// about 5 minutes of 2 cores, at low priority beside the tests.
const buildWait = 20 * time.Minute

// waitForBuild waits while scripts/deps.sh builds Jaeger in the background
// (bin.building holds the builder's pid) and reports whether it waited: the
// binary is there when the build succeeded, else bin.build.log says why.
func waitForBuild(tb testing.TB, bin string) bool {
	b, err := os.ReadFile(bin + ".building")
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	tb.Logf("jaegertest: waiting for the build of jaeger %s under way (pid %d)", Version, pid)
	deadline := time.Now().Add(buildWait)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(bin); err == nil {
			return true
		}
		if syscall.Kill(pid, 0) != nil { // the builder is gone: built, or failed
			return true
		}
		time.Sleep(time.Second) // a build of minutes; nothing to be told by
	}
	return true
}

// buildLog returns the tail of the last background build's log, if any.
func buildLog(bin string) string {
	b, err := os.ReadFile(bin + ".build.log")
	if err != nil || len(b) == 0 {
		return ""
	}
	return "\nThe last background build's log ends:\n" + string(b[max(0, len(b)-2000):])
}

// Server is one Jaeger process owned by a test.
type Server struct {
	*proctest.Proc
	// OTLPEndpoint is the OTLP/HTTP receiver's base URL
	// (http://127.0.0.1:port): OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string
	// QueryURL is the query API's base URL (http://127.0.0.1:port).
	QueryURL string

	http *http.Client
}

// config is the all-in-one configuration (Jaeger's default: OTLP in,
// memory storage, the query API) on the test's own ports, without the
// receivers, extensions and internal metrics that would bind fixed ones.
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// Start starts Jaeger and returns once its OTLP receiver and its query API
// both answer.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := BinaryPath()
	if err == nil {
		_, err = os.Stat(bin)
		if err != nil && waitForBuild(tb, bin) {
			_, err = os.Stat(bin)
		}
	}
	if err != nil {
		tb.Fatalf("jaeger %s is not built (%v). Build it with `scripts/deps.sh` (or `make deps`; "+
			"`make test` runs it): it builds github.com/jaegertracing/jaeger/cmd/jaeger once per machine.%s", Version, err, buildLog(bin))
	}
	var lastErr error
	for range 3 { // a free port can be taken between probe and bind; try again
		s, err := launch(tb, bin)
		if err == nil {
			return s
		}
		lastErr = err
	}
	tb.Fatalf("jaegertest: start: %v", lastErr)
	return nil
}

func launch(tb testing.TB, bin string) (*Server, error) {
	var ports [3]int
	for i := range ports {
		p, err := proctest.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	query, grpc, otlp := ports[0], ports[1], ports[2]
	dir := proctest.TempDir(tb)
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, query, grpc, otlp), 0o600); err != nil {
		return nil, err
	}
	s := &Server{
		OTLPEndpoint: "http://127.0.0.1:" + strconv.Itoa(otlp),
		QueryURL:     "http://127.0.0.1:" + strconv.Itoa(query),
		http:         &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}},
	}
	s.Proc = proctest.New(tb, proctest.Spec{
		What:  fmt.Sprintf("jaeger (query %d, otlp %d)", query, otlp),
		Bin:   bin,
		Args:  []string{"--config", cfg},
		Log:   filepath.Join(dir, "jaeger.log"),
		Ready: s.ready,
	})
	if err := s.Start(); err != nil {
		return nil, err
	}
	tb.Cleanup(func() {
		s.Kill()
		s.http.CloseIdleConnections()
	})
	return s, nil
}

// ready polls both ports: the query API's service list, and an empty OTLP
// export (the receiver starts after the query extension).
func (s *Server) ready(exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("exited during start")
		default:
		}
		lastErr = s.get(context.Background(), "/api/services", nil, nil)
		if lastErr == nil {
			lastErr = s.postOTLP(`{}`)
			if lastErr == nil {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond) // polling the ports, the observable itself
	}
	return fmt.Errorf("not serving within %v: %v", startTimeout, lastErr)
}

func (s *Server) postOTLP(body string) error {
	resp, err := s.http.Post(s.OTLPEndpoint+"/v1/traces", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/traces: %s %s", resp.Status, b)
	}
	return nil
}

// get GETs path with query from the query API and decodes its JSON into v
// (nil: discarded).
func (s *Server) get(ctx context.Context, path string, query url.Values, v any) error {
	u := s.QueryURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", u, resp.Status, b)
	}
	if v == nil {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// Query selects traces in Traces. Service is required.
type Query struct {
	Service   string
	Operation string // a span name; empty: any
	Limit     int    // 0: 1000
}

// Traces returns the traces that have a span of q.Service (named
// q.Operation), each whole: the spans of every service in it. It searches
// the last hour.
func (s *Server) Traces(ctx context.Context, q Query) ([]Trace, error) {
	v := url.Values{"service": {q.Service}, "limit": {strconv.Itoa(cmp.Or(q.Limit, 1000))}}
	now := time.Now()
	v.Set("start", strconv.FormatInt(now.Add(-time.Hour).UnixMicro(), 10))
	v.Set("end", strconv.FormatInt(now.Add(time.Minute).UnixMicro(), 10))
	if q.Operation != "" {
		v.Set("operation", q.Operation)
	}
	var r response
	if err := s.get(ctx, "/api/traces", v, &r); err != nil {
		return nil, err
	}
	return r.Data, r.err()
}

// Trace returns the trace with id (32 hex digits).
func (s *Server) Trace(ctx context.Context, id string) (Trace, error) {
	var r response
	if err := s.get(ctx, "/api/traces/"+url.PathEscape(id), nil, &r); err != nil {
		return Trace{}, err
	}
	if err := r.err(); err != nil {
		return Trace{}, err
	}
	if len(r.Data) != 1 {
		return Trace{}, fmt.Errorf("trace %s: %d traces in the answer", id, len(r.Data))
	}
	return r.Data[0], nil
}

// response is the query API's answer (Jaeger's UI model).
type response struct {
	Data   []Trace `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

func (r response) err() error {
	var errs []error
	for _, e := range r.Errors {
		errs = append(errs, fmt.Errorf("jaeger query: %d %s", e.Code, e.Msg))
	}
	return errors.Join(errs...)
}
