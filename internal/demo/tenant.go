package demo

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/jobs"
)

// The second demo job, demo:tenant.sync, syncs a tenant by working for
// work_ms under the tenant's resource of TenantLimit permits: at most 3
// syncs of one tenant run at once, each on a permit with its own fence. Its
// store is fenced per (tenant, permit), with the same begin and commit as an
// order's, so a stale holder of a permit is refused once that permit's next
// holder has begun.
const (
	TenantType  = "demo:tenant.sync"
	TenantLimit = 3
)

// TenantPayload is demo:tenant.sync's payload, e.g. {"tenant_id":"7","work_ms":500}.
type TenantPayload struct {
	TenantID string `json:"tenant_id"`
	WorkMS   int64  `json:"work_ms"`
}

// TenantResource is the resource of a tenant's syncs.
func TenantResource(tenantID string) string { return "lock:tenant:" + tenantID }

// TenantStore is the fenced record of one permit of a tenant under prefix.
func TenantStore(prefix, tenantID string, permit int) string {
	return tenantStores(prefix) + tenantID + ":" + strconv.Itoa(permit)
}

// tenantStores is what every TenantStore under prefix starts with.
func tenantStores(prefix string) string { return prefix + "demo:tenant:" }

// TenantWrites is the accepted-writes log of tenant syncs under prefix; its
// entries' order_id is TenantSlot's name of the (tenant, permit).
func TenantWrites(prefix string) string { return prefix + "demo:tenant:writes" }

// TenantSlot names a tenant's permit in TenantWrites: "<tenant>/<permit>".
func TenantSlot(tenantID string, permit int) string { return tenantID + "/" + strconv.Itoa(permit) }

// TenantSpec returns demo:tenant.sync for a worker: its records name workerID.
func TenantSpec(client redis.UniversalClient, prefix, workerID string, opts ...Option) jobs.Spec {
	d := newJob(client, prefix, workerID, opts)
	return jobs.Spec{
		Type:     TenantType,
		Decode:   DecodeTenant,
		Resource: func(p any) string { return TenantResource(p.(TenantPayload).TenantID) },
		Limit:    TenantLimit,
		Run: func(ctx context.Context, j jobs.Job, payload any) error {
			p := payload.(TenantPayload)
			tg := target{store: TenantStore(d.prefix, p.TenantID, j.Permit), name: TenantSlot(p.TenantID, j.Permit),
				stream: Stream(d.prefix), writes: TenantWrites(d.prefix), workMS: p.WorkMS}
			return d.runOn(ctx, j, tg, Execution{TenantID: p.TenantID})
		},
	}
}

// DecodeTenant reads and checks a demo:tenant.sync payload.
func DecodeTenant(b []byte) (any, error) {
	var p TenantPayload
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if err := checkPayload("tenant_id", p.TenantID, "{}/", p.WorkMS); err != nil {
		return nil, err
	}
	return p, nil
}

// ReadTenantExecutions returns the demo:tenant.sync entries of the
// executions stream (Stream: they have tenant_id and permit for order_id),
// oldest first.
func ReadTenantExecutions(ctx context.Context, c redis.UniversalClient, prefix string) ([]Execution, error) {
	all, err := ReadExecutions(ctx, c, prefix)
	return slices.DeleteFunc(all, func(x Execution) bool { return x.TenantID == "" }), err
}

// ReadTenantWrites returns every entry of TenantWrites, oldest first; on a
// Redis Cluster, every tenant permit's log (RecordWrites), one after another.
func ReadTenantWrites(ctx context.Context, c redis.UniversalClient, prefix string) ([]Write, error) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return readRecordWrites(ctx, cc, prefix, tenantStores(prefix))
	}
	return readWrites(ctx, c, TenantWrites(prefix))
}
