package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

// testConfig is quick: short backoff, short lock TTL, frequent polling.
func testConfig() Config {
	return Config{
		Concurrency:     4,
		ShutdownTimeout: 2 * time.Second,
		LockTTL:         300 * time.Millisecond,
		Backoff:         backoff.Jitter{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
	}
}

// env is one Server on a private redis-server, with what tests need to
// enqueue, inspect and interfere.
type env struct {
	t       *testing.T
	redis   *redistest.Server
	client  *redis.Client // shared by the server, as in the binary
	admin   *redis.Client // the test's own connection
	locker  *lock.Locker
	metrics *metrics.Metrics
	srv     *Server
	enq     *asynq.Client
	insp    *asynq.Inspector
	logs    proctest.Log // every server's JSON log (Info and above)
}

func newEnv(t *testing.T, cfg Config, specs ...Spec) *env {
	t.Helper()
	return newEnvWith(t, cfg, func(*redis.Client) []Spec { return specs })
}

// orderSpec is a job like the demo's: a JSON payload naming an order, whose
// lock it takes; it does nothing. The demo itself (internal/demo) is tested
// in its own package.
func orderSpec() Spec {
	return Spec{
		Type: orderType,
		Decode: func(b []byte) (any, error) {
			var p struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(b, &p); err != nil {
				return nil, err
			}
			if p.OrderID == "" {
				return nil, errors.New("order_id is required")
			}
			return p.OrderID, nil
		},
		Resource: func(p any) string { return "lock:order:" + p.(string) },
		Run:      func(context.Context, Job, any) error { return nil },
	}
}

const orderType = "test:order"

// newEnvWith runs the specs that build returns for the server's client.
func newEnvWith(t *testing.T, cfg Config, build func(*redis.Client) []Spec) *env {
	t.Helper()
	rs := redistest.Start(t)
	e := &env{
		t:       t,
		redis:   rs,
		client:  rs.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }),
		admin:   rs.Client(),
		metrics: metrics.New(nil),
	}
	e.locker = lock.New(e.client, lock.WithMetrics(e.metrics))
	e.enq = asynq.NewClientFromRedisClient(rs.Client())
	e.insp = asynq.NewInspectorFromRedisClient(rs.Client())
	t.Cleanup(func() {
		_ = e.enq.Close()
		_ = e.insp.Close()
	})
	e.srv = e.startServer(e.client, e.locker, cfg, build(e.client))
	return e
}

// addWorkerWith starts one more server on client c that recovery takes for
// another process, named process (its lock tokens still name this one: for
// handlers without a lock). Not for a parallel test: it swaps processName.
func (e *env) addWorkerWith(c *redis.Client, process string, cfg Config, specs ...Spec) *Server {
	e.t.Helper()
	defer func(f func() string) { processName = f }(processName)
	processName = func() string { return process }
	return e.startServer(c, lock.New(c, lock.WithMetrics(e.metrics)), cfg, specs)
}

// addWorker starts one more server on the same Redis, with a client, Locker
// and watchdog of its own, as another worker process would have. It shares
// the env's metrics.
func (e *env) addWorker(cfg Config, specs ...Spec) *Server {
	e.t.Helper()
	c := e.redis.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	return e.startServer(c, lock.New(c, lock.WithMetrics(e.metrics)), cfg, specs)
}

func (e *env) startServer(c *redis.Client, l *lock.Locker, cfg Config, specs []Spec) *Server {
	e.t.Helper()
	reg, err := NewRegistry(specs)
	if err != nil {
		e.t.Fatal(err)
	}
	wd := watchdog.New(watchdog.Options{Metrics: e.metrics, Notifier: watchdog.Tracking(c, l.KeyPrefix(), nil)})
	srv := NewServer(Params{Client: c, Locker: l, Watchdog: wd, Registry: reg, Metrics: e.metrics, Config: cfg,
		Logger: slog.New(slog.NewJSONHandler(&e.logs, nil))})
	if err := wd.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
		if err := wd.Stop(ctx); err != nil {
			e.t.Errorf("watchdog stop: %v", err)
		}
	})
	return srv
}

// enqueue adds a task kept for an hour after it completes, so the inspector
// can still read its retry count.
func (e *env) enqueue(typ, id string, payload []byte, opts ...asynq.Option) {
	e.t.Helper()
	opts = append([]asynq.Option{asynq.TaskID(id), asynq.Retention(time.Hour)}, opts...)
	if _, err := e.enq.Enqueue(asynq.NewTask(typ, payload), opts...); err != nil {
		e.t.Fatalf("enqueue %s: %v", id, err)
	}
}

// enqueueID adds a task of type typ whose id is also its payload, with opts
// alone (no retention unless asked).
func (e *env) enqueueID(typ, id string, opts ...asynq.Option) {
	e.t.Helper()
	if _, err := e.enq.Enqueue(asynq.NewTask(typ, []byte(id)), append([]asynq.Option{asynq.TaskID(id)}, opts...)...); err != nil {
		e.t.Fatalf("enqueue %s: %v", id, err)
	}
}

func (e *env) info(id string) *asynq.TaskInfo {
	e.t.Helper()
	info, err := e.insp.GetTaskInfo("default", id)
	if err != nil {
		e.t.Fatalf("task %s: %v", id, err)
	}
	return info
}

// waitState waits until task id reaches state, failing the test when it is
// archived instead or the timeout passes.
func (e *env) waitState(id string, state asynq.TaskState, timeout time.Duration) *asynq.TaskInfo {
	e.t.Helper()
	var info *asynq.TaskInfo
	waitFor(e.t, timeout, "task "+id+" "+state.String(), func() bool {
		info = e.info(id)
		if info.State == asynq.TaskStateArchived && state != asynq.TaskStateArchived {
			e.t.Fatalf("task %s archived: %s", id, info.LastErr)
		}
		return info.State == state
	})
	return info
}

// completedOnce waits until task id completes and fails the test unless it
// ran once (runs counts the runs) without a retry.
func (e *env) completedOnce(id string, runs *atomic.Int32, timeout time.Duration) *asynq.TaskInfo {
	e.t.Helper()
	info := e.waitState(id, asynq.TaskStateCompleted, timeout)
	if info.Retried != 0 || runs.Load() != 1 {
		e.t.Fatalf("task %s completed with retried %d after %d runs, want 0 and 1", id, info.Retried, runs.Load())
	}
	return info
}

func (e *env) contended(typ string) float64 {
	return testutil.ToFloat64(e.metrics.JobContended.WithLabelValues(typ))
}

func (e *env) processed(typ, result string) float64 {
	return testutil.ToFloat64(e.metrics.JobsProcessed.WithLabelValues(typ, result))
}

func (e *env) lost(reason string) float64 {
	return testutil.ToFloat64(e.metrics.LockLost.WithLabelValues(reason))
}

// wantProcessed fails the test unless lockstep_jobs_processed_total{type,
// result} is want.
func (e *env) wantProcessed(typ, result string, want float64) {
	e.t.Helper()
	if got := e.processed(typ, result); got != want {
		e.t.Errorf("processed{%s, %s} = %v, want %v", typ, result, got, want)
	}
}

// waitFor waits for an observable condition (see redistest.WaitFor).
var waitFor = redistest.WaitFor

// lockedSpec is a handler of typ under lock resource that runs fn.
func lockedSpec(typ, resource string, fn func(ctx context.Context, job Job) error) Spec {
	return Spec{
		Type:     typ,
		Decode:   func(b []byte) (any, error) { return string(b), nil },
		Resource: func(any) string { return resource },
		Run:      func(ctx context.Context, job Job, _ any) error { return fn(ctx, job) },
	}
}

// countingSpec is a handler of typ under lock resource that counts its runs
// and does nothing else.
func countingSpec(typ, resource string, runs *atomic.Int32) Spec {
	return lockedSpec(typ, resource, func(context.Context, Job) error {
		runs.Add(1)
		return nil
	})
}

// countingEnv is an env with one countingSpec handler, and its run count.
func countingEnv(t *testing.T, typ, resource string) (*env, *atomic.Int32) {
	t.Helper()
	runs := new(atomic.Int32)
	return newEnv(t, testConfig(), countingSpec(typ, resource, runs)), runs
}
