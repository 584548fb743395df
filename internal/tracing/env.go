package tracing

import (
	"context"
	"io"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// shutdownTimeout bounds the flush of the spans not yet exported when a
// process role ends.
const shutdownTimeout = 5 * time.Second

// fromEnv builds the provider the OTEL_* variables ask for, and what shuts
// it down; nil until a binary links the SDK (internal/tracing/otelsdk).
var fromEnv func(ctx context.Context, lookup func(string) (string, bool), service string, stderr io.Writer) (trace.TracerProvider, func(context.Context) error, error)

// RegisterFromEnv is how internal/tracing/otelsdk, which alone imports
// OpenTelemetry's SDK and exporters, makes ForRole read the OTEL_*
// variables.
func RegisterFromEnv(f func(ctx context.Context, lookup func(string) (string, bool), service string, stderr io.Writer) (trace.TracerProvider, func(context.Context) error, error)) {
	fromEnv = f
}

// ForRole is the provider of a process role: own when the program passed
// one (it stays the program's to shut down); else, in a binary that links
// the SDK (internal/tracing/otelsdk: Lockstep's own binaries), the one the
// OTEL_* variables ask for, which end flushes and stops; else the global
// provider (otel.SetTracerProvider), which stays the program's.
func ForRole(own trace.TracerProvider, lookup func(string) (string, bool), service string, stderr io.Writer) (tp trace.TracerProvider, end func(), err error) {
	if own != nil {
		return own, func() {}, nil
	}
	if fromEnv == nil {
		return otel.GetTracerProvider(), func() {}, nil
	}
	p, shutdown, err := fromEnv(context.Background(), lookup, service, stderr)
	if err != nil {
		return nil, nil, err
	}
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = shutdown(ctx)
	}, nil
}
