// Command scheduler runs one replica of Lockstep's scheduler: every schedule
// of its configuration, each tick enqueued into asynq exactly once across all
// replicas (see internal/scheduler).
//
//	scheduler [--config configs/scheduler.yaml] [--http-addr :9091]
//
// Every configuration field can be overridden by a LOCKSTEP_* environment
// variable (see internal/config); --http-addr overrides http.addr. It serves
// /metrics, /healthz and /readyz (Redis answers PING and the scheduler runs).
//
// Exit codes: 0 after SIGTERM or SIGINT and a clean stop, or after --help; 2
// for a bad configuration or flag, with one line on stderr naming the file
// (or variable), the field and the value; 1 when starting or stopping fails.
// A second signal during the stop ends the process at once.
package main

import (
	"context"

	"github.com/lockstep-dev/lockstep/internal/role"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	_ "github.com/lockstep-dev/lockstep/internal/tracing/otelsdk"
)

func main() {
	role.Main("scheduler", func(ctx context.Context, env role.Env) error { return scheduler.Run(ctx, env) })
}
