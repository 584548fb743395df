package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// The demo job. Its names are contracts (DESIGN.md section 11): the demo,
// the tests and the benchmarks enqueue it and read what it records.
const (
	DemoType  = "demo:order.pay"
	DemoQueue = "default"
)

// Outcomes of a demo execution, the stream's outcome field.
const (
	OutcomeOK            = "ok"             // worked, and the fenced write was accepted
	OutcomeLockLost      = "lock_lost"      // the lock was lost while working
	OutcomeFenceRejected = "fence_rejected" // the store had seen a higher fence
	OutcomeCanceled      = "canceled"       // the context ended for another reason (shutdown, deadline)
)

// demoMaxWork bounds work_ms, so a typo cannot hold a lock for days.
const demoMaxWork = time.Hour

// demoStreamLen caps the executions stream (approximately).
const demoStreamLen = 100_000

// DemoPayload is the demo job's payload, e.g. {"order_id":"42","work_ms":300}.
type DemoPayload struct {
	OrderID string `json:"order_id"`
	WorkMS  int64  `json:"work_ms"`
}

// DemoResource is the lock the demo job takes for an order.
func DemoResource(orderID string) string { return "lock:order:" + orderID }

// DemoStream is the stream of demo executions under prefix.
func DemoStream(prefix string) string { return prefix + "demo:executions" }

// DemoStore is the fenced record of an order under prefix.
func DemoStore(prefix, orderID string) string { return prefix + "demo:order:" + orderID }

// Demo returns the demo job: it pays an order by working for work_ms under
// the order's lock, then writing to the order's fenced store, and records
// every execution in the stream with the worker id.
func Demo(client redis.UniversalClient, prefix, workerID string) Spec {
	d := &demo{client: client, prefix: prefix, worker: workerID}
	return Spec{
		Type:     DemoType,
		Decode:   decodeDemo,
		Resource: func(p any) string { return DemoResource(p.(DemoPayload).OrderID) },
		Run:      d.run,
	}
}

func decodeDemo(b []byte) (any, error) {
	var p DemoPayload
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	switch {
	case p.OrderID == "":
		return nil, errors.New("order_id is required")
	case strings.ContainsAny(p.OrderID, "{}"):
		return nil, fmt.Errorf("order_id %q must not contain '{' or '}'", p.OrderID)
	case p.WorkMS < 0 || time.Duration(p.WorkMS)*time.Millisecond > demoMaxWork:
		return nil, fmt.Errorf("work_ms %d is outside [0, %d]", p.WorkMS, demoMaxWork.Milliseconds())
	}
	return p, nil
}

type demo struct {
	client redis.UniversalClient
	prefix string
	worker string
}

func (d *demo) run(ctx context.Context, job Job, payload any) error {
	p := payload.(DemoPayload)
	started := time.Now()
	outcome, err := d.pay(ctx, job, p)
	if outcome == "" { // Redis failed: nothing to record that we know to be true
		return err
	}
	// Record even when the context ended: that is when the record matters.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if recErr := d.client.XAdd(rctx, &redis.XAddArgs{
		Stream: DemoStream(d.prefix),
		MaxLen: demoStreamLen,
		Approx: true,
		Values: []any{
			"order_id", p.OrderID,
			"fence", strconv.FormatInt(job.Fence, 10),
			"worker", d.worker,
			"started_ms", strconv.FormatInt(started.UnixMilli(), 10),
			"finished_ms", strconv.FormatInt(time.Now().UnixMilli(), 10),
			"outcome", outcome,
			// Not in the contract's field list; added so that readers can
			// tell a redelivered task (asynq delivers at least once) apart.
			"task_id", job.ID,
		},
	}).Err(); recErr != nil {
		err = errors.Join(err, fmt.Errorf("demo: record execution: %w", recErr))
	}
	return err
}

// pay works, honouring ctx, then writes; it returns the outcome, or "" when
// Redis failed.
func (d *demo) pay(ctx context.Context, job Job, p DemoPayload) (string, error) {
	work := time.NewTimer(time.Duration(p.WorkMS) * time.Millisecond)
	defer work.Stop()
	select {
	case <-ctx.Done():
		return ended(ctx)
	case <-work.C:
	}
	if ctx.Err() != nil {
		return ended(ctx)
	}
	reply, err := run(ctx, d.client, scriptFencedWrite, []string{DemoStore(d.prefix, p.OrderID)},
		job.Fence, d.worker, time.Now().UnixMilli())
	if err != nil {
		if ctx.Err() != nil {
			return ended(ctx)
		}
		return "", fmt.Errorf("demo: fenced write: %w", err)
	}
	vals, _ := reply.([]any)
	if len(vals) != 2 {
		return "", fmt.Errorf("demo: fenced write: unexpected reply %v", reply)
	}
	if vals[0] != int64(1) {
		return OutcomeFenceRejected, fmt.Errorf("demo: order %s: fence %d rejected, the store has %v", p.OrderID, job.Fence, vals[1])
	}
	return OutcomeOK, nil
}

// ended is the outcome of a run whose context ended.
func ended(ctx context.Context) (string, error) {
	cause := context.Cause(ctx)
	if errors.Is(cause, lock.ErrLockLost) {
		return OutcomeLockLost, cause
	}
	return OutcomeCanceled, cause
}
