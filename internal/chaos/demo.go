package chaos

import (
	"github.com/lockstep-dev/lockstep/internal/demo"
)

// The demo job's names, all taken from the demo package (this file is the
// one place that says where it lives).
var (
	demoType   = demo.Type
	demoQueue  = demo.Queue
	demoStream = demo.Stream
	// demoWrites is the demo store's log of accepted fenced writes (order_id,
	// fence, task_id, worker, op begin|commit, at_ms in Redis time), appended
	// in the same script that accepts each write.
	demoWrites = demo.Writes
	// readPostgresWrites reads the log table of the demo's PostgreSQL store
	// (demo.store postgres), the same fields in the store's order.
	readPostgresWrites = demo.ReadPostgresWrites
	// recordWriteLogs finds the log of each record of the store on a Redis
	// Cluster (demo.RecordWrites), where one log would span slots.
	recordWriteLogs = demo.RecordWriteLogs
)

type demoPayload = demo.Payload

// The resources the demo's jobs lock: an order's, a tenant's.
var (
	orderResource  = demo.Resource
	tenantResource = demo.TenantResource
)

// The demo's job with a limit: syncs of a few tenants, 3 at once each.
const (
	tenantType  = demo.TenantType
	tenantLimit = demo.TenantLimit
)

var tenantWrites = demo.TenantWrites

type tenantPayload = demo.TenantPayload

// The demo's rate-limited job: calls for a few clients, each client's starts
// under its quota (demo.RatedLimit).
const ratedType = demo.RatedType

var (
	ratedLimit  = demo.RatedLimit
	ratedStream = demo.RatedStream
)

type ratedPayload = demo.RatedPayload
