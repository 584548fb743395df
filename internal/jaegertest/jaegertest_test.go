package jaegertest_test

import (
	"context"
	"io"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/jaegertest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/tracing/otelsdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Spans exported over OTLP/HTTP, as the binaries export them (the OTEL_*
// variables read by otelsdk.FromEnv), come back from the query API with
// their service, parent, kind, attributes of each type, link and event.
func TestSpansComeBackFromTheQueryAPI(t *testing.T) {
	t.Parallel()
	jg := jaegertest.Start(t)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": jg.OTLPEndpoint, "OTEL_SERVICE_NAME": "probe"}
	p, err := otelsdk.FromEnv(t.Context(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, "unused", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := p.Tracer("test")
	_, other := tr.Start(context.Background(), "other")
	other.End()
	ctx, root := tr.Start(context.Background(), "root")
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(trace.Link{SpanContext: other.SpanContext()}),
		trace.WithAttributes(attribute.String("s", "v"), attribute.Int64("n", 42), attribute.Bool("b", true)))
	child.AddEvent("happened", trace.WithAttributes(attribute.String("why", "because")))
	child.End()
	root.End()
	if err := p.Shutdown(t.Context()); err != nil { // flushes the batch
		t.Fatal(err)
	}

	var got []jaegertest.Trace
	redistest.WaitFor(t, 10*time.Second, "the trace in Jaeger", func() bool {
		got, err = jg.Traces(t.Context(), jaegertest.Query{Service: "probe", Operation: "child"})
		return err == nil && len(got) == 1 && len(got[0].Spans) == 2
	})
	c := got[0]
	if c.TraceID != root.SpanContext().TraceID().String() {
		t.Errorf("trace id %s, want %s", c.TraceID, root.SpanContext().TraceID())
	}
	r, c1 := c.Find("root"), c.Find("child", jaegertest.With("n", "42"))
	if len(r) != 1 || len(c1) != 1 {
		t.Fatalf("spans %+v, want root and child", c.Spans)
	}
	s := c1[0]
	if s.Parent() != r[0].SpanID || r[0].Parent() != "" || c.Service(s) != "probe" {
		t.Errorf("child's parent %q (root %q, its parent %q), service %q", s.Parent(), r[0].SpanID, r[0].Parent(), c.Service(s))
	}
	for k, v := range map[string]string{"s": "v", "n": "42", "b": "true", "span.kind": "consumer"} {
		if s.Tag(k) != v {
			t.Errorf("tag %s = %q, want %q", k, s.Tag(k), v)
		}
	}
	if l := s.Links(); len(l) != 1 || l[0].SpanID != other.SpanContext().SpanID().String() || l[0].TraceID != other.SpanContext().TraceID().String() {
		t.Errorf("links %+v, want the other span %v", l, other.SpanContext())
	}
	if ev, ok := s.Event("happened"); !ok || ev.Field("why") != "because" {
		t.Errorf("events %+v, want happened with why=because", s.Logs)
	}
	byID, err := jg.Trace(t.Context(), other.SpanContext().TraceID().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := byID.Span(other.SpanContext().SpanID().String()); !ok {
		t.Errorf("trace by id %+v lacks the span", byID)
	}
}
