package scheduler

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
)

// Module provides the *Scheduler of the app's *config.SchedulerConfig over
// its redis.UniversalClient, and runs it from the app's start to its stop.
// *metrics.Metrics, *slog.Logger, a Clock and a trace.TracerProvider are
// used when provided.
var Module = fx.Module("scheduler", fx.Provide(newFromFx))

// Params are the Module's dependencies.
type Params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Client    redis.UniversalClient
	Config    *config.SchedulerConfig
	Metrics   *metrics.Metrics     `optional:"true"`
	Logger    *slog.Logger         `optional:"true"`
	Clock     Clock                `optional:"true"`
	Tracing   trace.TracerProvider `optional:"true"`
}

func newFromFx(p Params) (*Scheduler, error) {
	s, err := New(p.Client, p.Config, WithMetrics(p.Metrics), WithLogger(p.Logger), WithClock(p.Clock), WithTracerProvider(p.Tracing))
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.StartStopHook(s.Start, s.Stop))
	return s, nil
}
