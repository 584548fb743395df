// Command worker is Lockstep's default worker: it runs the built-in demo job
// (demo:order.pay, registered with worker.DemoJob) under its lock, with the
// configuration from --config (default configs/worker.yaml) and LOCKSTEP_*
// variables, and serves /metrics, /healthz and /readyz.
//
// A worker with your own handlers is the same binary with your handlers: see
// the worker package and examples/. It links the etcd back end (package
// etcd, for lock.backend etcd), pgx's database/sql driver (for the demo's
// demo.store postgres) and OpenTelemetry's SDK (the OTEL_* variables), which
// library code leaves to the program.
package main

import (
	_ "github.com/jackc/pgx/v5/stdlib"

	_ "github.com/lockstep-dev/lockstep/etcd"
	_ "github.com/lockstep-dev/lockstep/internal/tracing/otelsdk"
	"github.com/lockstep-dev/lockstep/worker"
)

func main() { worker.Main(worker.DemoJob()) }
