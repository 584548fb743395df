// Package demo is Lockstep's demo job, demo:order.pay: it pays an order by
// working for work_ms under the order's lock, with its writes fenced, and
// records every execution. The demo, the tests, the benchmarks and the chaos
// checker enqueue it and read what it records; its names are contracts
// (docs/workers.md, "The demo job").
//
// A run fences its store at both ends, the pattern docs/workers.md teaches for
// one's own store:
//
//  1. begin: the run's fence is recorded in the order's hash before any work,
//     refused if a run with a higher (or equal) fence has begun;
//  2. work, honouring the context (cancelled at once if the lock is lost);
//  3. commit: accepted only if no other run began since.
//
// A holder whose lock passed on (paused past its TTL, cut off) is so refused
// as soon as the next holder has begun, not only once it has finished.
// Every accepted begin and commit is also appended, in the same script, to
// the accepted-writes log, so a checker can replay the store's history: one
// log of every record on a single server or a Sentinel-managed master, one
// log per record on a Redis Cluster (RecordWrites), in the record's slot.
//
// The store is Redis (Lua scripts, the default) or, with WithPostgres,
// PostgreSQL, where each step is a transaction that checks the fence with
// package fence (Postgres). The executions stream stays in Redis either way.
package demo

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/script"
)

// Names of the demo job.
const (
	Type  = "demo:order.pay"
	Queue = "default"
)

// Outcomes of a demo execution, the stream's outcome field.
const (
	OutcomeOK            = "ok"             // worked, and the fenced commit was accepted
	OutcomeLockLost      = "lock_lost"      // the lock was lost while working
	OutcomeFenceRejected = "fence_rejected" // the store had seen a higher fence begin
	OutcomeCanceled      = "canceled"       // the context ended for another reason (shutdown, deadline)
)

// maxWork bounds work_ms, so a typo cannot hold a lock for days.
const maxWork = time.Hour

// Caps (approximate) of the executions stream and of the accepted-writes log.
const (
	streamLen = 100_000
	writesLen = 200_000
)

// Payload is the demo job's payload, e.g. {"order_id":"42","work_ms":300}.
type Payload struct {
	OrderID string `json:"order_id"`
	WorkMS  int64  `json:"work_ms"`
}

// Resource is the lock the demo job takes for an order.
func Resource(orderID string) string { return "lock:order:" + orderID }

// Stream is the stream of demo executions under prefix.
func Stream(prefix string) string { return prefix + "demo:executions" }

// Store is the fenced record of an order under prefix.
func Store(prefix, orderID string) string { return prefix + "demo:order:" + orderID }

// Writes is the log of accepted begins and commits under prefix, on single
// servers and Sentinel-managed masters. On a Redis Cluster one log would
// span slots with the records, so each record keeps its own (RecordWrites).
func Writes(prefix string) string { return prefix + "demo:writes" }

// RecordWrites is, on a Redis Cluster, the accepted-writes log of the one
// fenced record store (Store or TenantStore) under prefix: the record's key
// is its hash tag, so the script that accepts a write appends it in the
// record's own slot, and a failover keeps or loses the two together.
func RecordWrites(prefix, store string) string { return prefix + "demo:writes:{" + store + "}" }

var (
	//go:embed lua/begin.lua
	beginLua string
	//go:embed lua/commit.lua
	commitLua string

	scriptBegin  = script.New("demo/begin.lua", beginLua)
	scriptCommit = script.New("demo/commit.lua", commitLua)
)

// Option configures the demo jobs.
type Option func(*job)

// WithPostgres keeps the jobs' fenced store in pg instead of Redis.
func WithPostgres(pg *Postgres) Option { return func(d *job) { d.pg = pg } }

func newJob(client redis.UniversalClient, prefix, workerID string, opts []Option) *job {
	_, cluster := client.(*redis.ClusterClient)
	d := &job{client: client, prefix: prefix, worker: workerID, cluster: cluster}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Spec returns the demo job for a worker: its records name workerID.
func Spec(client redis.UniversalClient, prefix, workerID string, opts ...Option) jobs.Spec {
	d := newJob(client, prefix, workerID, opts)
	return jobs.Spec{
		Type:     Type,
		Decode:   Decode,
		Resource: func(p any) string { return Resource(p.(Payload).OrderID) },
		Run:      d.run,
	}
}

// Decode reads and checks a payload.
func Decode(b []byte) (any, error) {
	var p Payload
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if err := checkPayload("order_id", p.OrderID, "{}", p.WorkMS); err != nil {
		return nil, err
	}
	return p, nil
}

// checkPayload checks a demo payload's id (field, required, none of the
// characters of forbidden: they would break its key) and its work_ms.
func checkPayload(field, id, forbidden string, workMS int64) error {
	switch {
	case id == "":
		return fmt.Errorf("%s is required", field)
	case strings.ContainsAny(id, forbidden):
		return fmt.Errorf("%s %q must not contain any of %s", field, id, strings.Join(strings.Split(forbidden, ""), " "))
	case workMS < 0 || time.Duration(workMS)*time.Millisecond > maxWork:
		return fmt.Errorf("work_ms %d is outside [0, %d]", workMS, maxWork.Milliseconds())
	}
	return nil
}

type job struct {
	client  redis.UniversalClient
	prefix  string
	worker  string
	cluster bool      // a Redis Cluster: each record keeps its own accepted-writes log
	pg      *Postgres // the fenced store, when not Redis
}

// target is what one run of a demo job works on: the fenced record, the
// name the logs give it, and the streams it records to.
type target struct {
	store, name    string // the fenced record; its name in the accepted-writes log
	stream, writes string // the executions stream and the accepted-writes log
	workMS         int64
}

func (d *job) run(ctx context.Context, j jobs.Job, payload any) error {
	p := payload.(Payload)
	tg := target{store: Store(d.prefix, p.OrderID), name: p.OrderID, stream: Stream(d.prefix), writes: Writes(d.prefix), workMS: p.WorkMS}
	return d.runOn(ctx, j, tg, Execution{OrderID: p.OrderID})
}

// runOn runs one execution on tg and records it as x (its identity fields
// set) in tg's stream.
func (d *job) runOn(ctx context.Context, j jobs.Job, tg target, x Execution) error {
	started := time.Now()
	outcome, err := d.pay(ctx, j, tg)
	if outcome == "" { // the store failed: nothing to record that we know to be true
		return err
	}
	// Record even when the context ended: that is when the record matters.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if recErr := d.client.XAdd(rctx, &redis.XAddArgs{
		Stream: tg.stream,
		MaxLen: streamLen,
		Approx: true,
		Values: Execution{
			OrderID: x.OrderID, TenantID: x.TenantID, Permit: j.Permit, Fence: j.Fence, Worker: d.worker, TaskID: j.ID,
			StartedMS: started.UnixMilli(), FinishedMS: time.Now().UnixMilli(), Outcome: outcome,
		}.values(),
	}).Err(); recErr != nil && outcome != OutcomeOK {
		err = errors.Join(err, fmt.Errorf("demo: record execution: %w", recErr))
	}
	// A run that committed is done (G8) even when its record could not be
	// written: failing it now would have the task run, and pay, again. The
	// accepted-writes log, written in the commit's own script, has it.
	return err
}

// pay begins, works (honouring ctx), then commits; it returns the outcome,
// or "" when the store failed.
func (d *job) pay(ctx context.Context, j jobs.Job, p target) (string, error) {
	if ok, other, err := d.fenced(ctx, "begin", j, p); err != nil || !ok {
		return d.refused(ctx, "begin", j, p, other, err)
	}
	work := time.NewTimer(time.Duration(p.workMS) * time.Millisecond)
	defer work.Stop()
	select {
	case <-ctx.Done():
		return ended(ctx)
	case <-work.C:
	}
	if ctx.Err() != nil {
		return ended(ctx)
	}
	ok, other, err := d.fenced(ctx, "commit", j, p)
	if err != nil || !ok {
		return d.refused(ctx, "commit", j, p, other, err)
	}
	return OutcomeOK, nil
}

// fenced runs begin or commit; ok reports acceptance, other the fence that
// stood in the way.
func (d *job) fenced(ctx context.Context, op string, j jobs.Job, p target) (ok bool, other int64, err error) {
	if d.pg != nil {
		return d.pg.step(ctx, op, j, p.name, d.worker)
	}
	s := scriptBegin
	if op == "commit" {
		s = scriptCommit
	}
	keys := []string{p.store, p.writes}
	if d.cluster {
		keys[1] = RecordWrites(d.prefix, p.store)
	}
	reply, err := script.Run(ctx, d.client, s, "demo "+op, keys,
		j.Fence, j.ID, d.worker, writesLen, p.name)
	if err != nil {
		return false, 0, err
	}
	vals, _ := reply.([]any)
	if len(vals) != 2 {
		return false, 0, fmt.Errorf("demo %s: unexpected reply %v", op, reply)
	}
	other, _ = vals[1].(int64)
	return vals[0] == int64(1), other, nil
}

func (d *job) refused(ctx context.Context, op string, j jobs.Job, p target, other int64, err error) (string, error) {
	if err != nil {
		if ctx.Err() != nil {
			return ended(ctx)
		}
		return "", err
	}
	return OutcomeFenceRejected, fmt.Errorf("demo: %s: %s with fence %d refused: fence %d began since",
		p.name, op, j.Fence, other)
}

// ended is the outcome of a run whose context ended.
func ended(ctx context.Context) (string, error) {
	cause := context.Cause(ctx)
	if errors.Is(cause, lock.ErrLockLost) {
		return OutcomeLockLost, cause
	}
	return OutcomeCanceled, cause
}

// Execution is one entry of the executions stream.
type Execution struct {
	ID         string // the stream entry's id
	OrderID    string // demo:order.pay's
	TenantID   string // demo:tenant.sync's (then OrderID is "")
	Permit     int    // the permit a tenant's run held (0 for an order's lock, not recorded)
	Fence      int64  // the permit's fence
	Worker     string
	TaskID     string // the asynq task id (a redelivered task shows twice)
	StartedMS  int64
	FinishedMS int64
	Outcome    string
}

func (e Execution) values() []any {
	id := []any{"order_id", e.OrderID}
	if e.TenantID != "" { // a limited resource's run: the tenant and its permit
		id = []any{"tenant_id", e.TenantID, "permit", strconv.Itoa(e.Permit)}
	}
	return append(id,
		"fence", strconv.FormatInt(e.Fence, 10),
		"worker", e.Worker,
		"started_ms", strconv.FormatInt(e.StartedMS, 10),
		"finished_ms", strconv.FormatInt(e.FinishedMS, 10),
		"outcome", e.Outcome,
		// Not in the contract's field list; added so that readers can tell a
		// redelivered task (asynq delivers at least once) apart.
		"task_id", e.TaskID,
	)
}

// Write is one entry of the accepted-writes log.
type Write struct {
	ID      string // the stream entry's id: the log's order is the store's
	OrderID string
	Fence   int64
	TaskID  string
	Worker  string
	Op      string // "begin" or "commit"
	AtMS    int64  // Redis server time
}

// ReadExecutions returns every entry of the executions stream, oldest first.
func ReadExecutions(ctx context.Context, c redis.UniversalClient, prefix string) ([]Execution, error) {
	return readExecutions(ctx, c, Stream(prefix))
}

func readExecutions(ctx context.Context, c redis.UniversalClient, stream string) ([]Execution, error) {
	return readStream(ctx, c, stream, func(id string, f fields) Execution {
		return Execution{
			ID: id, OrderID: f.s("order_id"), TenantID: f.s("tenant_id"), Permit: int(f.n("permit")),
			Fence: f.n("fence"), Worker: f.s("worker"), TaskID: f.s("task_id"),
			StartedMS: f.n("started_ms"), FinishedMS: f.n("finished_ms"), Outcome: f.s("outcome"),
		}
	})
}

// ReadWrites returns every entry of the accepted-writes log of the orders,
// oldest first; on a Redis Cluster, every order's log (RecordWrites), each
// oldest first, one order after another.
func ReadWrites(ctx context.Context, c redis.UniversalClient, prefix string) ([]Write, error) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return readRecordWrites(ctx, cc, prefix, Store(prefix, ""))
	}
	return readWrites(ctx, c, Writes(prefix))
}

// RecordWriteLogs returns the keys of the records' accepted-writes logs on
// a Redis Cluster (RecordWrites): the orders' and the tenants', each sorted.
func RecordWriteLogs(ctx context.Context, c *redis.ClusterClient, prefix string) (orders, tenants []string, err error) {
	if orders, err = recordWriteLogs(ctx, c, prefix, Store(prefix, "")); err != nil {
		return nil, nil, err
	}
	tenants, err = recordWriteLogs(ctx, c, prefix, tenantStores(prefix))
	return orders, tenants, err
}

// recordWriteLogs returns the keys of the logs of the records whose keys
// start with store (RecordWrites's form), found on every master, sorted.
func recordWriteLogs(ctx context.Context, c *redis.ClusterClient, prefix, store string) ([]string, error) {
	var mu sync.Mutex
	var keys []string
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		it := m.Scan(ctx, 0, prefix+"demo:writes:{"+store+"*", 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			keys = append(keys, it.Val())
			mu.Unlock()
		}
		return it.Err()
	})
	slices.Sort(keys)
	return keys, err
}

// readRecordWrites reads the logs of the records whose keys start with store.
func readRecordWrites(ctx context.Context, c *redis.ClusterClient, prefix, store string) ([]Write, error) {
	keys, err := recordWriteLogs(ctx, c, prefix, store)
	if err != nil {
		return nil, fmt.Errorf("demo: find the records' accepted-writes logs: %w", err)
	}
	var out []Write
	for _, k := range keys {
		ws, err := readWrites(ctx, c, k)
		if err != nil {
			return nil, err
		}
		out = append(out, ws...)
	}
	return out, nil
}

func readWrites(ctx context.Context, c redis.UniversalClient, stream string) ([]Write, error) {
	return readStream(ctx, c, stream, func(id string, f fields) Write {
		return Write{ID: id, OrderID: f.s("order_id"), Fence: f.n("fence"), TaskID: f.s("task_id"),
			Worker: f.s("worker"), Op: f.s("op"), AtMS: f.n("at_ms")}
	})
}

// readStream returns every entry of stream, oldest first, each decoded by one.
func readStream[T any](ctx context.Context, c redis.UniversalClient, stream string, one func(id string, f fields) T) ([]T, error) {
	msgs, err := c.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("demo: read %s: %w", stream, err)
	}
	out := make([]T, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, one(m.ID, fields(m.Values)))
	}
	return out, nil
}

type fields map[string]any

func (f fields) s(k string) string { v, _ := f[k].(string); return v }
func (f fields) n(k string) int64  { v, _ := strconv.ParseInt(f.s(k), 10, 64); return v }
