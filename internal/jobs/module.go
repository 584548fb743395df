package jobs

import (
	"go.uber.org/fx"
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
		NewServer,
	),
	fx.Invoke(func(lc fx.Lifecycle, s *Server) { lc.Append(fx.StartStopHook(s.Start, s.Stop)) }),
)
