// Package otelsdk sets up OpenTelemetry's SDK and exporters from the
// standard OTEL_* variables for Lockstep's binaries. Library packages use the
// OpenTelemetry API only; a binary links this package (for its side effect:
// tracing.ForRole then builds the provider from OTEL_*), as cmd/worker,
// cmd/scheduler, cmd/lockstep and cmd/local do.
package otelsdk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lockstep-dev/lockstep/internal/tracing"
)

func init() {
	tracing.RegisterFromEnv(func(ctx context.Context, lookup func(string) (string, bool), service string, stderr io.Writer) (trace.TracerProvider, func(context.Context) error, error) {
		p, err := FromEnv(ctx, lookup, service, stderr)
		if err != nil {
			return nil, nil, err
		}
		return p.TracerProvider, p.Shutdown, nil
	})
}

// Provider is a process's tracer provider and what ends it.
type Provider struct {
	trace.TracerProvider
	// Shutdown flushes the spans not yet exported and stops the exporter.
	Shutdown func(context.Context) error
}

// FromEnv builds the provider the standard OTEL_* variables ask for, read
// through lookup (nil: the process's own); service is the service.name
// unless OTEL_SERVICE_NAME sets it. With none of them set it is a no-op
// provider: tracing off.
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: off.
//   - OTEL_TRACES_EXPORTER: otlp, console (to stderr), or both
//     comma-separated; unset means otlp when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, else off.
//   - OTEL_EXPORTER_OTLP_PROTOCOL (or ..._TRACES_PROTOCOL): http/protobuf
//     (default) or grpc. The exporters read the other OTEL_EXPORTER_OTLP_*
//     variables (headers, timeout, certificates) themselves.
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG: the standard
//     samplers; default parentbased_always_on.
//   - OTEL_RESOURCE_ATTRIBUTES: k=v,... on the resource.
//
// Spans are exported in batches (OTEL_BSP_* tune the batcher).
func FromEnv(ctx context.Context, lookup func(string) (string, bool), service string, stderr io.Writer) (*Provider, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	off := &Provider{TracerProvider: noop.NewTracerProvider(), Shutdown: func(context.Context) error { return nil }}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return off, nil
	}
	exporters := get("OTEL_TRACES_EXPORTER")
	endpoint, tracesEndpoint := get("OTEL_EXPORTER_OTLP_ENDPOINT"), get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if exporters == "" {
		if endpoint == "" && tracesEndpoint == "" {
			return off, nil
		}
		exporters = "otlp"
	}
	sampler, err := samplerFromEnv(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return nil, err
	}
	var exps []sdktrace.SpanExporter
	fail := func(err error) (*Provider, error) {
		for _, e := range exps {
			_ = e.Shutdown(ctx)
		}
		return nil, err
	}
	for _, name := range strings.Split(exporters, ",") {
		var exp sdktrace.SpanExporter
		var err error
		switch strings.TrimSpace(name) {
		case "none": // beside others too: none wins
			_, _ = fail(nil)
			return off, nil
		case "otlp":
			protocol := cmp.Or(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
			exp, err = otlpExporter(ctx, protocol, endpoint, tracesEndpoint)
		case "console":
			exp, err = stdouttrace.New(stdouttrace.WithWriter(stderr))
		default:
			err = fmt.Errorf("OTEL_TRACES_EXPORTER: unknown exporter %q (otlp, console or none)", name)
		}
		if err != nil {
			return fail(err)
		}
		exps = append(exps, exp)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cmp.Or(get("OTEL_SERVICE_NAME"), service))}
	for _, kv := range strings.Split(get("OTEL_RESOURCE_ATTRIBUTES"), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) != "" && strings.TrimSpace(k) != "service.name" {
			attrs = append(attrs, attribute.String(strings.TrimSpace(k), strings.TrimSpace(v)))
		}
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
	if err != nil {
		return fail(err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sampler), sdktrace.WithResource(res)}
	for _, e := range exps {
		opts = append(opts, sdktrace.WithBatcher(e))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Provider{TracerProvider: tp, Shutdown: tp.Shutdown}, nil
}

// otlpExporter is the OTLP exporter of protocol. An endpoint given through
// lookup is passed on explicitly; the exporter reads the rest itself.
func otlpExporter(ctx context.Context, protocol, endpoint, tracesEndpoint string) (sdktrace.SpanExporter, error) {
	switch protocol {
	case "http/protobuf":
		var o []otlptracehttp.Option
		switch {
		case tracesEndpoint != "":
			o = append(o, otlptracehttp.WithEndpointURL(tracesEndpoint))
		case endpoint != "":
			o = append(o, otlptracehttp.WithEndpointURL(strings.TrimSuffix(endpoint, "/")+"/v1/traces"))
		}
		return otlptracehttp.New(ctx, o...)
	case "grpc":
		var o []otlptracegrpc.Option
		if e := cmp.Or(tracesEndpoint, endpoint); e != "" {
			o = append(o, otlptracegrpc.WithEndpointURL(e))
		}
		return otlptracegrpc.New(ctx, o...)
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is not supported (http/protobuf or grpc)", protocol)
}

// samplerFromEnv is the sampler OTEL_TRACES_SAMPLER names.
func samplerFromEnv(name, arg string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, errors.New("OTEL_TRACES_SAMPLER_ARG: want a ratio in [0, 1], got " + strconv.Quote(arg))
		}
		return r, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: unknown sampler %q", name)
}
