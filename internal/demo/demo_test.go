package demo

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(sqltest.Main(m), redistest.LeakOptions()...) }

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		payload string
		ok      bool
	}{
		{`{"order_id":"42","work_ms":300}`, true},
		{`{"order_id":"42"}`, true},
		{`{"order_id":"","work_ms":1}`, false},
		{`{"order_id":42,"work_ms":1}`, false},
		{`{"order_id":"a}b","work_ms":1}`, false},
		{`{"order_id":"42","work_ms":-1}`, false},
		{`{"order_id":"42","work_ms":3600001}`, false},
		{`not json`, false},
	} {
		if _, err := Decode([]byte(c.payload)); (err == nil) != c.ok {
			t.Errorf("decode %s: err %v, want ok=%t", c.payload, err, c.ok)
		}
	}
}

// The store is fenced at both ends: a begin is refused once an equal or
// higher fence began, and a commit is accepted only from the run that began
// last; every accepted step is in the log, in the store's order.
func TestBeginAndCommitAreFenced(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	ctx := context.Background()
	step := func(s *redis.Script, fence int64, task string) []any {
		t.Helper()
		v, err := script.Run(ctx, c, s, "step", []string{Store("lockstep:", "1"), Writes("lockstep:")},
			fence, task, "w", 1000, "1")
		if err != nil {
			t.Fatal(err)
		}
		return v.([]any)
	}
	const f1, f2 = 1_700_000_000_000_010, 1_700_000_000_000_020
	for i, c := range []struct {
		s     *redis.Script
		fence int64
		want  []any
	}{
		{scriptBegin, f1, []any{int64(1), int64(f1)}},
		{scriptBegin, f1, []any{int64(0), int64(f1)}},  // the same fence cannot begin twice
		{scriptBegin, f2, []any{int64(1), int64(f2)}},  // the next holder begins
		{scriptCommit, f1, []any{int64(0), int64(f2)}}, // the stale holder's commit is refused already
		{scriptCommit, f2, []any{int64(1), int64(f2)}},
		{scriptBegin, f1, []any{int64(0), int64(f2)}}, // and so is a stale begin
	} {
		if got := step(c.s, c.fence, fmt.Sprint("t", i)); !slices.Equal(got, c.want) {
			t.Errorf("step %d (fence %d): %v, want %v", i, c.fence, got, c.want)
		}
	}
	h := c.HGetAll(ctx, Store("lockstep:", "1")).Val()
	if h["fence"] != fmt.Sprint(f2) || h["begun"] != fmt.Sprint(f2) || h["writes"] != "1" || h["task_id"] != "t4" {
		t.Fatalf("store = %v", h)
	}
	ws, err := ReadWrites(ctx, c, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	checkLog(t, ws, fmt.Sprint("begin ", f1, " t0"), fmt.Sprint("begin ", f2, " t2"), fmt.Sprint("commit ", f2, " t4"))
	if errs := StaleWrites(ws); len(errs) != 0 {
		t.Fatalf("stale writes in a clean log: %v", errs)
	}
}

// The checks find what they must: an overlap, a fence that went backwards, a
// stale commit and a task completed twice.
func TestChecksFindViolations(t *testing.T) {
	t.Parallel()
	execs := []Execution{
		{OrderID: "a", Fence: 10, TaskID: "1", StartedMS: 100, FinishedMS: 200, Outcome: OutcomeOK},
		{OrderID: "a", Fence: 20, TaskID: "2", StartedMS: 150, FinishedMS: 250, Outcome: OutcomeOK}, // overlaps 1
		{OrderID: "b", Fence: 30, TaskID: "3", StartedMS: 100, FinishedMS: 110, Outcome: OutcomeOK},
		{OrderID: "b", Fence: 25, TaskID: "3", StartedMS: 120, FinishedMS: 130, Outcome: OutcomeOK}, // fence back, twice
		{OrderID: "c", Fence: 1, TaskID: "4", StartedMS: 0, FinishedMS: 1000, Outcome: OutcomeOK},
		{OrderID: "c", Fence: 2, TaskID: "5", StartedMS: 10, FinishedMS: 20, Outcome: OutcomeOK}, // inside 4
		{OrderID: "c", Fence: 3, TaskID: "6", StartedMS: 30, FinishedMS: 40, Outcome: OutcomeOK}, // inside 4 too
	}
	if errs := Overlaps(execs); len(errs) != 4 {
		t.Errorf("overlaps: %d errors, want 4: %v", len(errs), errs)
	}
	if twice := CompletedTwice(execs); len(twice) != 1 || twice["3"] != 2 {
		t.Errorf("completed twice: %v, want task 3 twice", twice)
	}
	writes := []Write{
		{OrderID: "a", Fence: 10, Op: "begin"}, {OrderID: "a", Fence: 20, Op: "begin"},
		{OrderID: "a", Fence: 10, Op: "commit"}, // stale
		{OrderID: "b", Fence: 5, Op: "begin"}, {OrderID: "b", Fence: 5, Op: "commit"},
	}
	if errs := StaleWrites(writes); len(errs) != 1 {
		t.Errorf("stale writes: %v, want 1", errs)
	}
}

// env runs the demo job on a real Redis as worker "test-worker".
type env struct {
	admin *redis.Client
	enq   *asynq.Client
	insp  *asynq.Inspector
}

func newEnv(t *testing.T, opts ...Option) *env {
	t.Helper()
	rs := redistest.Start(t)
	c := rs.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	reg, err := jobs.NewRegistry([]jobs.Spec{Spec(c, "lockstep:", "test-worker", opts...)})
	if err != nil {
		t.Fatal(err)
	}
	srv := jobs.NewServer(jobs.Params{Client: c, Locker: l, Watchdog: wd, Registry: reg,
		Config: jobs.Config{Concurrency: 4, LockTTL: 10 * time.Second, PollInterval: 20 * time.Millisecond}})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &env{admin: rs.Client(), enq: asynq.NewClientFromRedisClient(rs.Client()), insp: asynq.NewInspectorFromRedisClient(rs.Client())}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
		_ = wd.Stop(ctx)
		_ = e.enq.Close()
		_ = e.insp.Close()
	})
	return e
}

func (e *env) enqueue(t *testing.T, id, payload string, opts ...asynq.Option) {
	t.Helper()
	opts = append([]asynq.Option{asynq.TaskID(id), asynq.Retention(time.Hour)}, opts...)
	if _, err := e.enq.Enqueue(asynq.NewTask(Type, []byte(payload)), opts...); err != nil {
		t.Fatal(err)
	}
}

func (e *env) waitState(t *testing.T, id string, state asynq.TaskState) *asynq.TaskInfo {
	t.Helper()
	var info *asynq.TaskInfo
	redistest.WaitFor(t, 15*time.Second, fmt.Sprintf("task %s %v", id, state), func() bool {
		var err error
		info, err = e.insp.GetTaskInfo(Queue, id)
		return err == nil && info.State == state
	})
	return info
}

// Each execution appends one entry with the contract's fields, plus the task
// id, for each outcome.
func TestRecordsExecutions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()

	e.enqueue(t, "ok", `{"order_id":"ok","work_ms":20}`)
	e.waitState(t, "ok", asynq.TaskStateCompleted)

	// A store where a higher fence has begun refuses the run.
	e.admin.HSet(ctx, Store("lockstep:", "stale"), "begun", "9000000000000000")
	e.enqueue(t, "stale", `{"order_id":"stale","work_ms":0}`, asynq.MaxRetry(0))
	e.waitState(t, "stale", asynq.TaskStateArchived)

	// Deleting the lock mid-work loses it.
	e.enqueue(t, "lost", `{"order_id":"lost","work_ms":10000}`, asynq.MaxRetry(0))
	redistest.WaitFor(t, 10*time.Second, "the lock", func() bool {
		return e.admin.Exists(ctx, "lockstep:{lock:order:lost}").Val() == 1
	})
	e.admin.Del(ctx, "lockstep:{lock:order:lost}")
	e.waitState(t, "lost", asynq.TaskStateArchived)

	msgs := e.admin.XRange(ctx, Stream("lockstep:"), "-", "+").Val()
	for _, m := range msgs {
		var keys []string
		for k := range m.Values {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if want := []string{"fence", "finished_ms", "order_id", "outcome", "started_ms", "task_id", "worker"}; !slices.Equal(keys, want) {
			t.Errorf("entry fields %v, want %v", keys, want)
		}
	}
	execs, err := ReadExecutions(ctx, e.admin, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Execution{}
	for _, x := range execs {
		got[x.OrderID] = x
	}
	for order, outcome := range map[string]string{"ok": OutcomeOK, "stale": OutcomeFenceRejected, "lost": OutcomeLockLost} {
		x := got[order]
		if x.Outcome != outcome || x.Worker != "test-worker" || x.TaskID != order {
			t.Errorf("order %s: %+v, want outcome %s by test-worker", order, x, outcome)
		}
		if x.Fence <= 0 || x.StartedMS <= 0 || x.FinishedMS < x.StartedMS {
			t.Errorf("order %s: %+v", order, x)
		}
	}
	if w := got["ok"]; fmt.Sprint(w.Fence) != e.admin.HGet(ctx, Store("lockstep:", "ok"), "fence").Val() {
		t.Errorf("the store's fence is not the ok execution's %d", w.Fence)
	}
	if lost := got["lost"]; lost.FinishedMS-lost.StartedMS > 5000 {
		t.Errorf("the lost run took %d ms: the deletion was not noticed at once", lost.FinishedMS-lost.StartedMS)
	}
}

// demo:tenant.sync runs at most 3 syncs of a tenant at once, each on its
// permit, records them with their permit, and fences its store per
// (tenant, permit): a stale holder of a permit is refused, not another
// permit's holder.
func TestTenantSyncRunsThreeAtOnceFencedPerPermit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	l := lock.New(c)
	wd := watchdog.New(watchdog.Options{})
	if err := wd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	reg, err := jobs.NewRegistry([]jobs.Spec{TenantSpec(c, "lockstep:", "w1")})
	if err != nil {
		t.Fatal(err)
	}
	s := jobs.NewServer(jobs.Params{Client: c, Locker: l, Watchdog: wd, Registry: reg,
		Config: jobs.Config{Concurrency: 8, LockTTL: 2 * time.Second}})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = s.Stop(ctx)
		_ = wd.Stop(ctx)
	}()
	enq := asynq.NewClientFromRedisClient(srv.Client())
	defer enq.Close()
	const n = 9
	for i := range n {
		if _, err := enq.Enqueue(asynq.NewTask(TenantType, []byte(`{"tenant_id":"7","work_ms":150}`)), asynq.TaskID(fmt.Sprint("s", i))); err != nil {
			t.Fatal(err)
		}
	}
	var execs []Execution
	redistest.WaitFor(t, 20*time.Second, "9 tenant syncs recorded", func() bool {
		execs, err = ReadTenantExecutions(ctx, c, "lockstep:")
		return err == nil && len(execs) == n
	})
	permits := map[int]bool{}
	for _, x := range execs {
		if x.TenantID != "7" || x.Outcome != OutcomeOK || x.Fence <= 0 {
			t.Fatalf("execution %+v", x)
		}
		permits[x.Permit] = true
	}
	if len(permits) != TenantLimit {
		t.Fatalf("permits used %v, want 0 to %d", permits, TenantLimit-1)
	}
	for _, err := range PermitOverlaps(execs, TenantLimit) {
		t.Error(err)
	}
	if errs := PermitOverlaps(execs, TenantLimit-1); len(errs) == 0 {
		t.Error("9 syncs of 150ms on 3 permits never ran 3 at once")
	}
	writes, err := ReadTenantWrites(ctx, c, "lockstep:")
	if err != nil || len(writes) != 2*n {
		t.Fatalf("%d tenant writes (%v), want a begin and a commit per sync", len(writes), err)
	}
	for _, err := range StaleWrites(writes) {
		t.Error(err)
	}
	// The store is per permit: a begin with permit 2's last fence is
	// refused on permit 2, and that same fence begins on permit 1's record
	// only if it is above permit 1's.
	last := map[int]int64{}
	for _, x := range execs {
		last[x.Permit] = max(last[x.Permit], x.Fence)
	}
	v, err := script.Run(ctx, c, scriptBegin, "begin", []string{TenantStore("lockstep:", "7", 2)}, last[2], "stale", "w9", 1000, TenantSlot("7", 2))
	if err != nil || v.([]any)[0] != int64(0) {
		t.Fatalf("a stale begin on permit 2: %v %v, want refused", v, err)
	}
}

func TestPermitOverlapsFindsViolations(t *testing.T) {
	t.Parallel()
	x := func(permit int, fence, from, to int64) Execution {
		return Execution{TenantID: "7", Permit: permit, Fence: fence, StartedMS: from, FinishedMS: to, Outcome: OutcomeOK}
	}
	ok := []Execution{x(0, 10, 0, 100), x(1, 5, 0, 100), x(2, 7, 0, 100), x(0, 11, 100, 200)}
	if errs := PermitOverlaps(ok, 3); len(errs) != 0 {
		t.Fatalf("a clean history: %v", errs)
	}
	for name, bad := range map[string][]Execution{
		"four at once":           append(ok[:3:3], x(3, 1, 50, 60)),
		"two on one permit":      {x(1, 5, 0, 100), x(1, 6, 50, 150)},
		"a permit's fence drops": {x(2, 7, 0, 100), x(2, 6, 100, 200)},
	} {
		if errs := PermitOverlaps(bad, 3); len(errs) == 0 {
			t.Errorf("%s: not found", name)
		}
	}
}

// checkLog checks that the writes of order 1 by worker "w" are want, each
// "<op> <fence> <task id>", in order.
func checkLog(t *testing.T, ws []Write, want ...string) {
	t.Helper()
	var got []string
	for _, w := range ws {
		got = append(got, fmt.Sprint(w.Op, " ", w.Fence, " ", w.TaskID))
		if w.OrderID != "1" || w.Worker != "w" || w.AtMS <= 0 {
			t.Errorf("log entry %+v", w)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
}

// On a Redis Cluster every record keeps its own accepted-writes log, in its
// slot: the begins and commits of orders and tenant permits on every
// master are accepted and logged (no CROSSSLOT), a stale commit is refused
// and not logged, and ReadWrites and ReadTenantWrites read every log back.
func TestWritesLoggedPerRecordOnCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	c := cl.Client()
	ctx := context.Background()
	d := newJob(c, "lockstep:", "w", nil)
	masters := map[*redistest.Server]bool{}
	step := func(op string, fence int64, task string, tg target) bool {
		t.Helper()
		ok, _, err := d.fenced(ctx, op, jobs.Job{ID: task, Fence: fence}, tg)
		if err != nil {
			t.Fatalf("%s %s: %v", op, tg.name, err)
		}
		return ok
	}
	var orders []string
	for i := 0; len(masters) < 3 && i < 100; i++ {
		order := fmt.Sprint(i)
		tg := target{store: Store("lockstep:", order), name: order}
		if !step("begin", 10, "a"+order, tg) || !step("begin", 20, "b"+order, tg) || step("commit", 10, "a"+order, tg) ||
			!step("commit", 20, "b"+order, tg) {
			t.Fatalf("order %s: the fences were not checked", order)
		}
		m := cl.NodeFor(tg.store)
		if cl.NodeFor(RecordWrites("lockstep:", tg.store)) != m {
			t.Fatalf("order %s's log is not in its record's slot", order)
		}
		masters[m] = true
		orders = append(orders, order)
	}
	tenant := target{store: TenantStore("lockstep:", "7", 2), name: TenantSlot("7", 2)}
	if !step("begin", 5, "s", tenant) || !step("commit", 5, "s", tenant) {
		t.Fatal("the tenant's permit refused its only run")
	}
	ws, err := ReadWrites(ctx, c, "lockstep:")
	if err != nil || len(ws) != 3*len(orders) {
		t.Fatalf("%d order writes (%v), want 3 for each of %d orders", len(ws), err, len(orders))
	}
	if errs := StaleWrites(ws); len(errs) != 0 {
		t.Fatalf("stale writes: %v", errs)
	}
	tw, err := ReadTenantWrites(ctx, c, "lockstep:")
	if err != nil || len(tw) != 2 || tw[0].OrderID != TenantSlot("7", 2) || tw[1].Op != "commit" {
		t.Fatalf("tenant writes %+v (%v), want the permit's begin and commit", tw, err)
	}
	if e := cl.Errors(); e["CROSSSLOT"] != 0 {
		t.Fatalf("errors %v", e)
	}
}
