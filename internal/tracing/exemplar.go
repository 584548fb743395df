package tracing

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Observe records v in o with the trace id of ctx's sampled span as its
// exemplar (label trace_id), or plainly when there is none.
func Observe(ctx context.Context, o prometheus.Observer, v float64) {
	ObserveIn(trace.SpanContextFromContext(ctx), o, v)
}

// ObserveIn is Observe with the span context itself.
func ObserveIn(sc trace.SpanContext, o prometheus.Observer, v float64) {
	if eo, ok := o.(prometheus.ExemplarObserver); ok && sc.IsSampled() {
		eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
		return
	}
	o.Observe(v)
}
