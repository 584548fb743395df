package worker_test

import (
	"context"
	"errors"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/worker"
)

// PayOrder is the payload of "order:pay" tasks, e.g. {"order_id":"42","amount_cents":1999}.
type PayOrder struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Validate rejects a payload that no retry could fix: such a task is archived
// with this reason instead of being retried.
func (p PayOrder) Validate() error {
	if p.OrderID == "" || p.AmountCents <= 0 {
		return errors.New("order_id and a positive amount_cents are required")
	}
	return nil
}

// payOrder runs with the order's lock held. Its context ends if the lock is
// lost; job.Fence goes with the write so that the store can refuse a holder
// whose lock has passed on.
func payOrder(ctx context.Context, job worker.Job, p PayOrder) error {
	return ledger.Charge(ctx, p.OrderID, p.AmountCents, job.Fence)
}

// The main function of your own worker binary: register the handlers and
// hand over to worker.Main, which reads --config, --http-addr and LOCKSTEP_*
// variables, serves /metrics, /healthz and /readyz, and shuts down on
// SIGTERM after releasing every lock.
func ExampleHandle() {
	worker.Main(
		worker.Handle("order:pay", payOrder).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second),
	)
}

// Rebuild is the payload of "cache:rebuild" tasks.
type Rebuild struct {
	Cache string `json:"cache"`
}

func rebuild(ctx context.Context, job worker.Job, p Rebuild) error { return ctx.Err() }

// Each handler says what a busy lock means for its tasks: Requeue (the
// default) puts the task back without using its retries; Skip completes it as
// a duplicate of the run in progress; Wait waits in the worker for a while.
func ExampleHandlerOf_OnContention() {
	worker.Main(
		worker.Handle("order:pay", payOrder).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second), // Requeue
		worker.Handle("cache:rebuild", rebuild).
			Lock(func(p Rebuild) string { return "lock:cache:" + p.Cache }, time.Minute).
			OnContention(worker.Skip()),
	)
}

// Requeue, the default: a busy lock puts the task in the resource's queue, in
// arrival order, without using its retries; the holder's release hands the
// lock to it.
func ExampleRequeue() {
	worker.Main(
		worker.Handle("order:pay", payOrder).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second).
			OnContention(worker.Requeue()),
	)
}

// Skip: a task whose lock is busy is a duplicate of the run in progress; it
// completes without running, recorded as skipped.
func ExampleSkip() {
	worker.Main(
		worker.Handle("cache:rebuild", rebuild).
			Lock(func(p Rebuild) string { return "lock:cache:" + p.Cache }, time.Minute).
			OnContention(worker.Skip()),
	)
}

// Wait: a task whose lock is busy waits in its worker for up to two seconds,
// woken by the release that hands it the lock; then it is requeued.
func ExampleWait() {
	worker.Main(
		worker.Handle("order:pay", payOrder).
			Lock(func(p PayOrder) string { return "lock:order:" + p.OrderID }, 30*time.Second).
			OnContention(worker.Wait(2 * time.Second)),
	)
}

// SyncPayload is the payload of "tenant.sync" tasks.
type SyncPayload struct {
	TenantID string `json:"tenant_id"`
}

// syncTenant runs holding one of its tenant's 3 permits: job.Permit says which,
// and job.Fence is that permit's fence.
func syncTenant(ctx context.Context, job worker.Job, p SyncPayload) error {
	return ledger.Charge(ctx, p.TenantID, 0, job.Fence)
}

// Limit: at most 3 syncs run at once per tenant; a fourth waits its turn
// as for a lock (the contention policy applies when all 3 permits are held).
func ExampleHandlerOf_Limit() {
	handler := worker.Handle("tenant.sync", syncTenant).
		Lock(func(p SyncPayload) string { return "lock:tenant:" + p.TenantID }, 30*time.Second).
		Limit(3)
	worker.Main(handler)
}

// Report is the payload of "report:build" tasks.
type Report struct {
	ID    string   `json:"id"`
	Parts []string `json:"parts"`
}

// buildReport reports progress after each part: a run stuck in one part (a
// call that ignores ctx) stalls, and its lock goes to the next task.
func buildReport(ctx context.Context, job worker.Job, p Report) error {
	for _, part := range p.Parts {
		if err := render(ctx, part); err != nil {
			return err
		}
		lockstep.Progress(ctx) // one atomic store, never a round trip
	}
	return nil
}

func render(ctx context.Context, part string) error { return ctx.Err() }

// StallAfter and MaxHold: a run that reports no progress for 2 minutes, or
// holds its lock for an hour, is cancelled and its lock handed on at once.
func ExampleHandlerOf_StallAfter() {
	handler := worker.Handle("report:build", buildReport).
		Lock(func(p Report) string { return "report:" + p.ID }, 0).
		StallAfter(2 * time.Minute). // no lockstep.Progress for 2 minutes: stalled
		MaxHold(time.Hour)           // held an hour: given up, progress or not
	worker.Main(handler)
}

// CallPayload is the payload of "partner.call" tasks.
type CallPayload struct {
	PartnerID string `json:"partner_id"`
}

func callPartner(ctx context.Context, job worker.Job, p CallPayload) error {
	return ledger.Charge(ctx, p.PartnerID, 0, job.Fence)
}

// Rate: at most 100 calls a second per partner, 10 at once, across every
// worker; a task over the rate is delayed to its turn, never failed.
func ExampleHandlerOf_Rate() {
	handler := worker.Handle("partner.call", callPartner).
		Rate(func(p CallPayload) string { return "rate:partner:" + p.PartnerID },
			lockstep.RateLimit{N: 100, Per: time.Second, Burst: 10})
	worker.Main(handler)
}

// ExportPayload is the payload of "tenant.export" tasks, e.g.
// {"tenant_id":"t7","plan":"premium"}.
type ExportPayload struct {
	TenantID string `json:"tenant_id"`
	Plan     string `json:"plan"`
}

func exportTenant(ctx context.Context, job worker.Job, p ExportPayload) error {
	return ledger.Charge(ctx, p.TenantID, 0, job.Fence)
}

// FairBy: the workers are shared equally among the tenants with tasks
// waiting, so one tenant's burst of 10,000 tasks does not hold up the
// others; each tenant's tasks start in the order they were enqueued.
func ExampleHandlerOf_FairBy() {
	handler := worker.Handle("tenant.export", exportTenant).
		FairBy(func(p ExportPayload) string { return p.TenantID })
	worker.Main(handler)
}

// FairByWeighted: a premium tenant gets twice a standard one's share.
func ExampleHandlerOf_FairByWeighted() {
	handler := worker.Handle("tenant.export", exportTenant).
		FairByWeighted(func(p ExportPayload) (string, int) {
			if p.Plan == "premium" {
				return p.TenantID, 2
			}
			return p.TenantID, 1
		})
	worker.Main(handler)
}

// ledger stands for the store the handler writes to.
var ledger interface {
	Charge(ctx context.Context, orderID string, cents, fence int64) error
}
