package etcdtest

import (
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// LeakOptions are the goleak options for tests that talk to etcd (and Redis:
// they include redistest's). A closed etcd client's gRPC connection ends its
// goroutines shortly after Close returns.
func LeakOptions() []goleak.Option {
	return append(redistest.LeakOptions(),
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}
