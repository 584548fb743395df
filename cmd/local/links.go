//go:build !localonly

package main

// The etcd back end (lock.backend etcd) and OpenTelemetry's SDK (the OTEL_*
// variables) are linked in every build but make run's, which builds with
// -tags localonly: an embedded Redis, nothing exported, and half the packages
// to compile on a fresh machine.
import (
	_ "github.com/lockstep-dev/lockstep/etcd"
	_ "github.com/lockstep-dev/lockstep/internal/tracing/otelsdk"
)
