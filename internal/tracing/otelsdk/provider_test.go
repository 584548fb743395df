package otelsdk_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/tracing"
	"github.com/lockstep-dev/lockstep/internal/tracing/otelsdk"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// With none of the OTEL_* variables set, or tracing turned off by them,
// the provider is a no-op one: New gives the nil Tracer, which starts no
// span and leaves contexts alone.
func TestFromEnvOffIsNoop(t *testing.T) {
	t.Parallel()
	for _, vars := range [][]string{
		nil,
		{"OTEL_SERVICE_NAME", "x"},
		{"OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"},
		{"OTEL_SDK_DISABLED", "true", "OTEL_TRACES_EXPORTER", "console"},
	} {
		p, err := otelsdk.FromEnv(t.Context(), env(vars...), "svc", io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", vars, err)
		}
		tr := tracing.New(p.TracerProvider)
		if tr != nil {
			t.Errorf("%v: tracing on, want off", vars)
		}
		ctx := context.Background()
		if got, span := tr.StartTick(ctx, "s", time.Now(), "r"); got != ctx || span != nil {
			t.Errorf("%v: the off tracer changed the context or started a span", vars)
		}
		if err := p.Shutdown(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// OTEL_EXPORTER_OTLP_ENDPOINT alone turns OTLP/HTTP export on: the spans
// reach the collector at <endpoint>/v1/traces, named by OTEL_SERVICE_NAME,
// once the provider is shut down (its batch flushed).
func TestFromEnvExportsOTLPToTheEndpoint(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies [][]byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if r.URL.Path == "/v1/traces" {
			bodies = append(bodies, b)
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	p, err := otelsdk.FromEnv(t.Context(), env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL, "OTEL_SERVICE_NAME", "billing-worker"), "lockstep-worker", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := tracing.New(p.TracerProvider)
	if tr == nil {
		t.Fatal("tracing off with an OTLP endpoint set")
	}
	_, span := tr.StartTick(context.Background(), "settle", time.Unix(1700000000, 0), "r0")
	span.Outcome(tracing.TickEnqueued)
	span.End()
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	all := bytes.Join(bodies, nil)
	for _, want := range []string{"lockstep.tick", "billing-worker", "settle", "2023-11-14T22:13:20Z"} {
		if !bytes.Contains(all, []byte(want)) {
			t.Errorf("the collector got no %q in %d requests to /v1/traces", want, len(bodies))
		}
	}
}

// The console exporter writes spans to the given stderr; a bad exporter,
// protocol or sampler is an error naming its variable.
func TestFromEnvConsoleAndErrors(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	p, err := otelsdk.FromEnv(t.Context(), env("OTEL_TRACES_EXPORTER", "console", "OTEL_TRACES_SAMPLER", "always_on"), "svc", &out)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.New(p.TracerProvider).StartTick(context.Background(), "s", time.Now(), "r")
	span.End()
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"lockstep.tick"`) {
		t.Errorf("console output %q has no tick span", out.String())
	}
	for vars, name := range map[[6]string]string{
		{"OTEL_TRACES_EXPORTER", "zipkin"}:                                                                         "OTEL_TRACES_EXPORTER",
		{"OTEL_TRACES_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"}:                               "OTEL_EXPORTER_OTLP_PROTOCOL",
		{"OTEL_TRACES_EXPORTER", "console", "OTEL_TRACES_SAMPLER", "sometimes"}:                                    "OTEL_TRACES_SAMPLER",
		{"OTEL_TRACES_EXPORTER", "console", "OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "2"}: "OTEL_TRACES_SAMPLER_ARG",
	} {
		_, err := otelsdk.FromEnv(t.Context(), env(vars[:]...), "svc", io.Discard)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: error %v, want one naming %s", vars, err, name)
		}
	}
}
