package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	_ "github.com/lockstep-dev/lockstep/etcd" // lock.backend etcd in Check
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

type pay struct {
	OrderID string `json:"order_id"`
	Cents   int64  `json:"cents"`
}

func (p *pay) Validate() error {
	if p.Cents <= 0 {
		return errors.New("cents must be positive")
	}
	return nil
}

func orderLock(p pay) string { return "lock:order:" + p.OrderID }

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHandleBuildsTypedSpec(t *testing.T) {
	t.Parallel()
	var got pay
	var gotJob Job
	s, err := Handle("order:pay", func(_ context.Context, job Job, p pay) error {
		got, gotJob = p, job
		return nil
	}).Lock(orderLock, 5*time.Second).spec()
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != "order:pay" || s.TTL != 5*time.Second || s.Resource == nil {
		t.Fatalf("spec %+v", s)
	}
	p, err := s.Decode([]byte(`{"order_id":"42","cents":100,"extra":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Resource(p); r != "lock:order:42" {
		t.Fatalf("resource %q", r)
	}
	if err := s.Run(context.Background(), jobs.Job{ID: "t1", Fence: 7}, p); err != nil {
		t.Fatal(err)
	}
	if got != (pay{OrderID: "42", Cents: 100}) || gotJob.ID != "t1" || gotJob.Fence != 7 {
		t.Fatalf("handler got %+v, %+v", got, gotJob)
	}
	for _, bad := range []string{`{"order_id":"42","cents":0}`, `{"order_id":42}`, `[`} {
		if _, err := s.Decode([]byte(bad)); err == nil {
			t.Errorf("decode %s: no error", bad)
		}
	}

	noLock, err := Handle("report", func(context.Context, Job, struct{}) error { return nil }).spec()
	if err != nil || noLock.Resource != nil {
		t.Fatalf("handler without Lock: %+v, %v", noLock, err)
	}
	if _, err := Handle[pay]("nil", nil).spec(); err == nil {
		t.Error("nil handler function accepted")
	}
	if _, err := Handle("neg", func(context.Context, Job, pay) error { return nil }).Lock(orderLock, -time.Second).spec(); err == nil {
		t.Error("negative ttl accepted")
	}

	noop := Handle("p", func(context.Context, Job, pay) error { return nil }).Lock(orderLock, 0)
	for _, c := range []struct {
		c    Contention
		want jobs.Contention
		wait time.Duration
	}{
		{Requeue(), jobs.Requeue, 0}, {Skip(), jobs.Skip, 0}, {Wait(time.Second), jobs.Wait, time.Second},
	} {
		s, err := noop.OnContention(c.c).spec()
		if err != nil || s.Contention != c.want || s.ContentionWait != c.wait {
			t.Errorf("OnContention(%+v): %v %v %v", c.c, s.Contention, s.ContentionWait, err)
		}
	}
	if s, _ := noop.spec(); s.Contention != jobs.Requeue {
		t.Errorf("default contention %v, want Requeue", s.Contention)
	}
	if _, err := noop.OnContention(Wait(0)).spec(); err == nil {
		t.Error("Wait(0) accepted")
	}
}

// Run serves a user's handler under its lock with the job's identity and
// fence, archives a payload that fails validation, and returns nil once its
// context ends, with no lock left behind.
func TestRunServesHandlers(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: %q}
http: {addr: "127.0.0.1:0"}
log: {level: error}
lock: {ttl: 2s}
worker: {concurrency: 2, shutdown_timeout: 1s, contention_backoff_min: 10ms, contention_backoff_max: 100ms, demo: false}
`, rs.Addr))
	admin := rs.Client()
	type call struct {
		job  Job
		p    pay
		held string
	}
	calls := make(chan call, 1)
	h := Handle("order:pay", func(ctx context.Context, job Job, p pay) error {
		calls <- call{job, p, admin.Get(ctx, "lockstep:{lock:order:42}").Val()}
		return nil
	}).Lock(orderLock, 0)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"--config", cfg}, h) }()

	enq := asynq.NewClientFromRedisClient(admin)
	insp := asynq.NewInspectorFromRedisClient(admin)
	defer enq.Close()
	defer insp.Close()
	if _, err := enq.Enqueue(asynq.NewTask("order:pay", []byte(`{"order_id":"42","cents":5}`)), asynq.TaskID("p1"), asynq.MaxRetry(4)); err != nil {
		t.Fatal(err)
	}
	if _, err := enq.Enqueue(asynq.NewTask("order:pay", []byte(`{"order_id":"43","cents":0}`)), asynq.TaskID("p2")); err != nil {
		t.Fatal(err)
	}
	var c call
	select {
	case c = <-calls:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("handler not called")
	}
	want := Job{ID: "p1", Type: "order:pay", Queue: "default", Attempt: 1, MaxRetry: 4, Resource: "lock:order:42", Fence: c.job.Fence}
	if c.job != want || c.job.Fence <= 0 || c.p != (pay{"42", 5}) || c.held == "" {
		t.Fatalf("handler saw job %+v payload %+v lock %q; want job %+v with a fence, the lock held", c.job, c.p, c.held, want)
	}
	var info *asynq.TaskInfo
	redistest.WaitFor(t, 20*time.Second, "the invalid payload p2 archived", func() bool {
		var err error
		info, err = insp.GetTaskInfo("default", "p2")
		return err == nil && info.State == asynq.TaskStateArchived
	})
	if !strings.Contains(info.LastErr, "cents must be positive") {
		t.Errorf("archived with %q, want the validation error", info.LastErr)
	}

	cancel()
	if err := redistest.Receive(t, done, 10*time.Second, "Run to return after its context ended"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if keys := admin.Keys(context.Background(), "lockstep:{*}").Val(); len(keys) != 0 {
		t.Fatalf("lock keys left: %v", keys)
	}
}

func TestRunRejectsBadFlagsAndConfig(t *testing.T) {
	t.Parallel()
	good := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\n")
	for name, args := range map[string][]string{
		"unknown flag":     {"--nope"},
		"extra argument":   {"--config", good, "extra"},
		"missing file":     {"--config", filepath.Join(t.TempDir(), "none.yaml")},
		"bad http address": {"--config", good, "--http-addr", "nowhere"},
		"bad config":       {"--config", writeConfig(t, "worker: {concurrency: -1}\nlock: {ttl: 0s}\n")},
	} {
		err := Run(context.Background(), args)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is more than one line: %q", name, err)
		}
	}
}

// The demo on demo.store postgres needs pgx's driver, which this package
// does not link (a program chooses its driver): the worker refuses to start
// with a configuration error naming the key and the import; without the demo
// the store is never opened, so the setting costs nothing.
func TestDemoPostgresStoreNeedsItsDriverLinked(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\ndemo: {store: postgres, postgres_dsn: \"postgres://u:secret@127.0.0.1:1/d\"}\n")
	err := Check([]string{"--config", cfg}, DemoJob())
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "demo.store") ||
		!strings.Contains(err.Error(), `import _ "github.com/jackc/pgx/v5/stdlib"`) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Check with the demo on postgres, no driver linked = %v, want a config error naming demo.store and the import", err)
	}
	if err := Check([]string{"--config", cfg}); err != nil {
		t.Fatalf("Check without the demo = %v", err)
	}
}

func TestDuplicateTaskTypeFails(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\n")
	h := Handle(demo.Type, func(context.Context, Job, pay) error { return nil })
	// The demo job is registered only when asked.
	if err := Check([]string{"--config", cfg}, h); err != nil {
		t.Fatalf("Check without the demo job = %v", err)
	}
	err := Check([]string{"--config", cfg}, h, DemoJob())
	if err == nil || errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "registered twice") {
		t.Fatalf("Check = %v, want the duplicate type", err)
	}
	demoOn := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\nworker: {demo: true}\n")
	if err := Check([]string{"--config", demoOn}, h); err == nil || !strings.Contains(err.Error(), "registered twice") {
		t.Fatalf("Check with worker.demo: true = %v, want the duplicate type", err)
	}
	if err := Check([]string{"--config", cfg}, Handle("other", func(context.Context, Job, pay) error { return nil })); err != nil {
		t.Fatalf("Check = %v", err)
	}
}

func TestLimitIsCheckedAtStart(t *testing.T) {
	t.Parallel()
	h := Handle("tenant:sync", func(context.Context, Job, pay) error { return nil })
	var got Job
	h = Handle("tenant:sync", func(_ context.Context, job Job, _ pay) error { got = job; return nil })
	s, err := h.Lock(orderLock, 0).Limit(3).spec()
	if err != nil || s.Limit != 3 {
		t.Fatalf("Limit(3): %+v %v", s.Limit, err)
	}
	if s, _ := h.Lock(orderLock, 0).spec(); s.Limit != 1 {
		t.Fatalf("without Limit the limit is %d, want 1 (a lock)", s.Limit)
	}
	if err := s.Run(context.Background(), jobs.Job{ID: "t1", Fence: 7, Permit: 2}, pay{}); err != nil || got.Permit != 2 || got.Fence != 7 {
		t.Fatalf("the handler got %+v (%v), want permit 2 fence 7", got, err)
	}
	for _, bad := range []HandlerOf[pay]{h.Lock(orderLock, 0).Limit(0), h.Lock(orderLock, 0).Limit(-2), h.Limit(2)} {
		if _, err := bad.spec(); err == nil || !strings.Contains(err.Error(), "Limit") {
			t.Errorf("%+v accepted: %v", bad, err)
		}
	}
	// Redlock has no permits: the worker refuses to start (exit 2). etcd has.
	redlock := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\nlock: {backend: redlock, nodes: [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]}\n")
	err = Check([]string{"--config", redlock}, h.Lock(orderLock, 0).Limit(3))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "has no permits") || strings.Contains(err.Error(), "\n") {
		t.Errorf("redlock: Check = %v, want one line matching ErrConfig", err)
	}
	if err := Check([]string{"--config", redlock}, h.Lock(orderLock, 0)); err != nil {
		t.Errorf("redlock: a plain lock: %v", err)
	}
	etcd := writeConfig(t, "redis: {addr: \"127.0.0.1:1\"}\nlock: {backend: etcd, etcd: {endpoints: [\"127.0.0.1:1\"]}}\n")
	if err := Check([]string{"--config", etcd}, h.Lock(orderLock, 0).Limit(3)); err != nil {
		t.Errorf("etcd: a limit: %v", err)
	}
	// What go doc says of the back ends is what this test saw: etcd takes
	// a limit, Redlock refuses one.
	limitDoc := docOf(t, "handler.go", "// Limit lets")
	if !strings.Contains(limitDoc, "redis or etcd") || !strings.Contains(limitDoc, "redlock") || strings.Contains(limitDoc, "etcd refuse") {
		t.Errorf("HandlerOf.Limit's doc does not say that redis and etcd take a limit and redlock refuses one:\n%s", limitDoc)
	}
	// Recovery within TTL + 3s runs on every back end (cmd/worker's
	// recovery tests kill holders on Redis and on etcd).
	if d := docOf(t, "doc.go", "//   - A worker that crashes"); !strings.Contains(d, "every lock") || strings.Contains(d, "asynq's") {
		t.Errorf("the package doc's recovery claim is not that of every back end:\n%s", d)
	}
}

// docOf returns the comment block of file that starts with first.
func docOf(t *testing.T, file, first string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, first)
	if i < 0 {
		t.Fatalf("%s has no comment starting %q", file, first)
	}
	var lines []string
	for line := range strings.SplitSeq(s[i:], "\n") {
		if !strings.HasPrefix(line, "//") {
			break
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// OnStart hands the program the worker's own Redis client, logger and
// variables before the first task runs, so a handler uses them without
// reading the environment again; an OnStart error keeps the worker from
// starting.
func TestOnStartLendsTheWorkersClientBeforeTheFirstTask(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf("redis: {addr: %q}\nhttp: {addr: \"127.0.0.1:0\"}\nlog: {level: error}\nworker: {demo: false}\n", rs.Addr))
	var rt Runtime // set by OnStart, read by the handler: OnStart happens before any task
	ran := make(chan string, 1)
	h := Handle("note", func(ctx context.Context, job Job, p pay) error {
		if err := rt.Redis.Set(ctx, "note:"+p.OrderID, job.ID, 0).Err(); err != nil {
			return err
		}
		ran <- p.OrderID
		return nil
	})
	lookup := func(k string) (string, bool) {
		if k == "MY_SERVICE_DSN" {
			return "dsn", true
		}
		return "", false
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Env{Args: []string{"--config", cfg}, LookupEnv: lookup, Stderr: io.Discard}.Run(ctx,
			OnStart(func(_ context.Context, r Runtime) error { rt = r; return nil }), h)
	}()
	enq := asynq.NewClientFromRedisClient(rs.Client())
	defer enq.Close()
	if _, err := enq.Enqueue(asynq.NewTask("note", []byte(`{"order_id":"7","cents":1}`)), asynq.TaskID("n1")); err != nil {
		t.Fatal(err)
	}
	redistest.Receive(t, ran, 20*time.Second, "the handler to run")
	if got := rs.Client().Get(ctx, "note:7").Val(); got != "n1" {
		t.Errorf("the handler wrote %q through the worker's client, want n1", got)
	}
	if v, _ := rt.Lookup("MY_SERVICE_DSN"); v != "dsn" || rt.Log == nil || rt.Queues["default"] == 0 || rt.LockPrefix != "lockstep:" {
		t.Errorf("Runtime %+v: want the worker's variables, logger, queues and lock prefix", rt)
	}
	cancel()
	if err := redistest.Receive(t, done, 10*time.Second, "Run to return"); err != nil {
		t.Fatal(err)
	}

	boom := errors.New("store unreachable")
	err := Env{Args: []string{"--config", cfg}, Stderr: io.Discard}.Run(context.Background(),
		OnStart(func(context.Context, Runtime) error { return boom }), h)
	if !errors.Is(err, boom) {
		t.Fatalf("Run with a failing OnStart: %v, want its error", err)
	}
}
