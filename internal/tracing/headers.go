package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// propagator is W3C Trace Context and Baggage, whatever the process's global
// propagator is: the headers are a contract between Lockstep's own
// processes.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Inject returns the asynq task headers that carry ctx's trace context
// (traceparent, tracestate, baggage), or nil when ctx has none.
func Inject(ctx context.Context) map[string]string {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	if len(c) == 0 {
		return nil
	}
	return c
}

// Extract returns ctx with the remote trace context of a task's headers.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	return propagator.Extract(ctx, propagation.MapCarrier(headers))
}
