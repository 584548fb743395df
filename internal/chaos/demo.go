package chaos

import (
	"github.com/lockstep-dev/lockstep/internal/jobs"
)

// The demo job's names, all taken from the demo package (its home may move:
// this file is the one place that says where it lives).
var (
	demoType   = jobs.DemoType
	demoQueue  = jobs.DemoQueue
	demoStream = jobs.DemoStream
)

type demoPayload = jobs.DemoPayload

// demoWrites is the demo store's log of accepted fenced writes (order_id,
// fence, task_id, worker, op begin|commit, at_ms in Redis time), appended in
// the same script that accepts each write. Until the demo keeps it the
// stream is absent, and the checker says so.
func demoWrites(prefix string) string { return prefix + "demo:writes" }
