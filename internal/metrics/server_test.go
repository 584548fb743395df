package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockstep-dev/lockstep/internal/lifecycle"
)

// client does not keep connections alive, so no goroutine outlives a test.
var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// startServer starts a server on a free port and stops it when the test ends.
func startServer(t *testing.T, g prometheus.Gatherer, checks map[string]func(context.Context) error) *Server {
	t.Helper()
	s := NewServer("127.0.0.1:0", g, checks, nil)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := client.Get("http://" + s.Addr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestServerEndpoints(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "lockstep_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	redisDown := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	s := startServer(t, reg, map[string]func(context.Context) error{
		"redis": func(context.Context) error { return redisDown },
	})
	if strings.HasSuffix(s.Addr(), ":0") {
		t.Errorf("Addr() = %s, want the real port", s.Addr())
	}

	// /metrics and /healthz answer while the Redis check fails.
	if code, body := get(t, s, "/metrics"); code != http.StatusOK || !strings.Contains(body, "lockstep_test_total 3") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body := get(t, s, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, s, "/readyz"); code != http.StatusServiceUnavailable || body != "redis: "+redisDown.Error()+"\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := get(t, s, "/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d", code)
	}
}

// /metrics answers in OpenMetrics, with the histograms' exemplars (trace
// ids), to a scraper that asks for it, and in the Prometheus text format
// otherwise.
func TestServerMetricsOpenMetricsWithExemplars(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.LockHeld.(prometheus.ExemplarObserver).ObserveWithExemplar(0.2, prometheus.Labels{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"})
	s := startServer(t, reg, nil)
	req, err := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("Content-Type %q, want OpenMetrics", ct)
	}
	if !strings.Contains(string(body), `# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.2`) {
		t.Errorf("OpenMetrics body has no exemplar:\n%s", body)
	}
	if _, plain := get(t, s, "/metrics"); strings.Contains(plain, "trace_id") || !strings.Contains(plain, "lockstep_lock_held_seconds_count 1") {
		t.Errorf("plain /metrics: %q", plain)
	}
}

func TestServerReadiness(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) error { return nil }
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	tests := []struct {
		name     string
		checks   map[string]func(context.Context) error
		wantCode int
		wantBody string
	}{
		{"no checks", nil, http.StatusOK, "ok\n"},
		{"all pass", map[string]func(context.Context) error{"redis": ok, "role": ok}, http.StatusOK, "ok\n"},
		{"one line per failure, sorted", map[string]func(context.Context) error{
			"role":  func(context.Context) error { return errors.New("scheduler not\nrunning") },
			"redis": func(context.Context) error { return errors.New("NOAUTH") },
			"other": ok,
		}, http.StatusServiceUnavailable, "redis: NOAUTH\nrole: scheduler not running\n"},
		{"panic", map[string]func(context.Context) error{
			"redis": func(context.Context) error { panic("boom") },
		}, http.StatusServiceUnavailable, "redis: panic: boom\n"},
		{"check that ignores its context", map[string]func(context.Context) error{
			"redis": ok,
			"stuck": func(context.Context) error { <-release; return nil },
		}, http.StatusServiceUnavailable, "stuck: no answer within 50ms\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := NewServer("127.0.0.1:0", prometheus.NewRegistry(), tt.checks, nil)
			s.readyTimeout = 50 * time.Millisecond
			if err := s.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer s.Stop(context.Background())
			if code, body := get(t, s, "/readyz"); code != tt.wantCode || body != tt.wantBody {
				t.Errorf("/readyz = %d %q, want %d %q", code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestServerReadyChecksSeeDeadline(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil, map[string]func(context.Context) error{
		"redis": func(ctx context.Context) error {
			if _, ok := ctx.Deadline(); !ok {
				return errors.New("no deadline")
			}
			return nil
		},
	})
	if code, body := get(t, s, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d %q", code, body)
	}
}

func TestServerStartBadAddress(t *testing.T) {
	t.Parallel()
	busy := startServer(t, nil, nil)
	for _, addr := range []string{busy.Addr(), "127.0.0.1:99999", "not an address"} {
		s := NewServer(addr, nil, nil, nil)
		if err := s.Start(t.Context()); err == nil {
			s.Stop(context.Background())
			t.Errorf("Start(%q) succeeded", addr)
		} else if !strings.HasPrefix(err.Error(), "metrics server: ") {
			t.Errorf("Start(%q) = %v", addr, err)
		}
	}
}

func TestServerStop(t *testing.T) {
	t.Parallel()
	s := NewServer("127.0.0.1:0", nil, nil, nil)
	if err := s.Stop(t.Context()); err != nil {
		t.Errorf("Stop before Start = %v", err)
	}
	s = NewServer("127.0.0.1:0", nil, nil, nil)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if err := s.Start(t.Context()); err != nil || s.Addr() != addr {
		t.Errorf("second Start = %v (address %s, was %s), want nil and the same listener", err, s.Addr(), addr)
	}
	if code, _ := get(t, s, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	for range 2 {
		if err := s.Stop(t.Context()); err != nil {
			t.Errorf("Stop = %v", err)
		}
	}
	if _, err := client.Get("http://" + addr + "/healthz"); err == nil {
		t.Error("server still answers after Stop")
	}
	if err := s.Start(t.Context()); !errors.Is(err, lifecycle.ErrStopped) {
		t.Errorf("Start after Stop = %v, want lifecycle.ErrStopped", err)
	}
}

func TestServerStopDropsSlowRequests(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	s := NewServer("127.0.0.1:0", nil, map[string]func(context.Context) error{
		"slow": func(ctx context.Context) error { close(entered); <-release; return nil },
	}, nil)
	s.readyTimeout = time.Minute
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := client.Get("http://" + s.Addr() + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := s.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop = %v, want deadline exceeded", err)
	}
	if err := <-done; err == nil {
		t.Error("request in flight was not dropped")
	}
	close(release)
}
