package jobs

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

// Group is the fx value group that handlers (Specs) are provided into.
const Group = "jobs"

// Module provides the Registry of every Spec in the value group "jobs" and
// the Server, started and stopped with the app. It needs a
// redis.UniversalClient, *lock.Locker, *watchdog.Watchdog, *metrics.Metrics,
// *slog.Logger and Config.
var Module = fx.Module("jobs",
	fx.Provide(
		fx.Annotate(NewRegistry, fx.ParamTags(`group:"`+Group+`"`)),
		func(in serverIn) *Server {
			return NewServer(Params{
				Client: in.Client, Locker: in.Locker, Watchdog: in.Watchdog, Registry: in.Registry,
				Metrics: in.Metrics, Logger: in.Logger, Config: in.Config,
			})
		},
	),
	fx.Invoke(func(lc fx.Lifecycle, s *Server) { lc.Append(fx.StartStopHook(s.Start, s.Stop)) }),
)

type serverIn struct {
	fx.In
	Client   redis.UniversalClient
	Locker   *lock.Locker
	Watchdog *watchdog.Watchdog
	Registry *Registry
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
	Config   Config
}
