package tracing

import (
	"context"
	"io"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// shutdownTimeout bounds the flush of the spans not yet exported when a
// process role ends.
const shutdownTimeout = 5 * time.Second

// ForRole is the provider of a process role: own when the program passed
// one (it stays the program's to shut down), else the one the OTEL_*
// variables ask for (FromEnv). end flushes and stops the latter.
func ForRole(own trace.TracerProvider, lookup func(string) (string, bool), service string, stderr io.Writer) (tp trace.TracerProvider, end func(), err error) {
	if own != nil {
		return own, func() {}, nil
	}
	p, err := FromEnv(context.Background(), lookup, service, stderr)
	if err != nil {
		return nil, nil, err
	}
	return p.TracerProvider, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = p.Shutdown(ctx)
	}, nil
}
