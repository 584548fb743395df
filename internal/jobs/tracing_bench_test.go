package jobs

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracerProvider is the rig's provider: nil (tracing off) unless the rig is
// traced, then the SDK with its batch exporter sending OTLP/HTTP to a
// collector stub that reads and drops the spans, as a worker with
// OTEL_EXPORTER_OTLP_ENDPOINT set would run.
func (r *benchRig) tracerProvider(b *testing.B) trace.TracerProvider {
	if !r.traced {
		return nil
	}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	r.spans = tp
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		collector.Close()
	})
	return tp
}

// flushSpans exports the spans the batcher still holds, so that their cost
// counts in the run that made them.
func (r *benchRig) flushSpans(b *testing.B) {
	if r.spans == nil {
		return
	}
	if err := r.spans.ForceFlush(context.Background()); err != nil {
		b.Fatal(err)
	}
}
