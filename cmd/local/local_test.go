package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, redistest.LeakOptions()...)
}

const (
	schedulerConfig = "../../configs/local-scheduler.yaml"
	workerConfig    = "../../configs/local-worker.yaml"
)

func configArgs(extra ...string) []string {
	return append([]string{"--scheduler-config", schedulerConfig, "--worker-config", workerConfig}, extra...)
}

// embeddedRedis makes the run start its embedded Redis whatever the
// environment says.
func embeddedRedis(t *testing.T) {
	if v, ok := os.LookupEnv(envRedisAddr); ok {
		t.Setenv(envRedisAddr, v) // restored after the test
		if err := os.Unsetenv(envRedisAddr); err != nil {
			t.Fatal(err)
		}
	}
}

// buffer is a bytes.Buffer that the run and the test may use at once.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// seen is what the test reads from Redis once the roles stopped.
type seen struct {
	res       result
	ticks     map[string][]int64 // schedule -> tick task ids' seconds, from asynq's tasks in every state
	taskIDs   int                // tick tasks in asynq
	completed map[string]bool    // ids of completed tasks
	records   []map[string]any   // the demo stream
}

func readRedis(t *testing.T, ctx context.Context, c redis.UniversalClient, res result) *seen {
	t.Helper()
	s := &seen{res: res, ticks: map[string][]int64{}, completed: map[string]bool{}}
	in := asynq.NewInspectorFromRedisClient(c)
	lists := map[string]func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		"pending": in.ListPendingTasks, "active": in.ListActiveTasks, "scheduled": in.ListScheduledTasks,
		"retry": in.ListRetryTasks, "archived": in.ListArchivedTasks, "completed": in.ListCompletedTasks,
	}
	ids := map[string]bool{}
	for state, list := range lists {
		for page := 1; ; page++ {
			tasks, err := list(demo.Queue, asynq.PageSize(500), asynq.Page(page))
			if err != nil {
				t.Fatalf("list %s tasks: %v", state, err)
			}
			for _, task := range tasks {
				if ids[task.ID] {
					t.Errorf("task %s listed twice", task.ID)
				}
				ids[task.ID] = true
				if state == "completed" {
					s.completed[task.ID] = true
				}
				name, sec, ok := strings.Cut(task.ID, ":")
				u, err := strconv.ParseInt(sec, 10, 64)
				if !ok || err != nil {
					t.Errorf("task id %q is not <schedule>:<unix seconds>", task.ID)
					continue
				}
				s.ticks[name] = append(s.ticks[name], u)
			}
			if len(tasks) < 500 {
				break
			}
		}
	}
	s.taskIDs = len(ids)
	msgs, err := c.XRange(ctx, res.execs.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		s.records = append(s.records, m.Values)
	}
	return s
}

// The local run on the embedded Redis, for a few seconds: every tick of
// every schedule is enqueued once (one task id each, none missing between
// the first and the last), every completed task ran to success exactly once,
// and the run exits 0.
func TestRunEmbedded(t *testing.T) {
	embeddedRedis(t)
	// The roles get the embedded Redis's address as a parameter, so the run
	// writes no configuration file anywhere: not even a temporary
	// directory can be made.
	notDir := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", notDir)
	var out, errOut buffer
	var got *seen
	code := run(t.Context(), configArgs("--duration", "6s", "--every", "1s"), &out, &errOut, hooks{
		afterStop: func(ctx context.Context, c redis.UniversalClient, res result) { got = readRedis(t, ctx, c, res) },
	})
	t.Logf("stdout:\n%s", out.String())
	if e := errOut.String(); e != "" {
		t.Logf("stderr:\n%s", e)
	}
	if code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if got == nil {
		t.Fatal("afterStop never ran")
	}
	stdout := out.String()
	checkOutput(t, stdout, "embedded Redis (miniredis, in memory)")
	if n := len(regexp.MustCompile(`(?m)^\[ *\d+s\] ticks \d+ enqueued \(scheduler-1 \d+, scheduler-2 \d+\)`).FindAllString(stdout, -1)); n < 4 {
		t.Errorf("%d summary lines, want at least 4", n)
	}

	// Ticks: exactly once each.
	enqueued := total(got.res.final.enqueued)
	if enqueued == 0 || got.res.final.duplicate != 0 || got.res.final.missed != 0 {
		t.Errorf("schedulers: %d enqueued, %d duplicate, %d missed; want some, 0, 0", enqueued, got.res.final.duplicate, got.res.final.missed)
	}
	for _, c := range got.res.final.enqueued {
		if c.n == 0 {
			t.Errorf("%s enqueued no tick: both replicas should win some", c.role)
		}
	}
	if got.taskIDs != enqueued {
		t.Errorf("asynq holds %d tick tasks, the replicas enqueued %d", got.taskIDs, enqueued)
	}
	cfg, err := config.LoadScheduler(schedulerConfig, func(k string) (string, bool) {
		return map[string]string{envRedisAddr: "127.0.0.1:1"}[k], k == envRedisAddr
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range cfg.Schedules {
		checkTicks(t, sc.Name, sc.Cron, got.ticks[sc.Name])
		delete(got.ticks, sc.Name)
	}
	for name := range got.ticks {
		t.Errorf("tasks of unknown schedule %q", name)
	}

	// Executions: every completed task ran to success exactly once, and
	// only the completed ones did.
	ok := map[string]int{}
	for _, r := range got.records {
		if r["outcome"] != demo.OutcomeOK {
			t.Logf("execution not ok (possible on a very slow machine): %v", r)
			continue
		}
		ok[r["task_id"].(string)]++
	}
	if len(got.completed) == 0 {
		t.Error("no task completed")
	}
	for id := range got.completed {
		if ok[id] != 1 {
			t.Errorf("completed task %s has %d ok executions, want 1", id, ok[id])
		}
	}
	for id, n := range ok {
		if !got.completed[id] {
			t.Errorf("task %s ran ok %d times but is not completed", id, n)
		}
	}
	if got.res.execs.ok() != len(got.completed) {
		t.Errorf("the run counted %d ok executions, Redis has %d completed tasks", got.res.execs.ok(), len(got.completed))
	}
	if v := got.res.execs.violations; len(v) > 0 {
		t.Errorf("violations: %q", v)
	}
}

// checkTicks asserts that ticks (Unix seconds) are distinct and every tick of
// spec between the first and the last is there.
func checkTicks(t *testing.T, name, spec string, ticks []int64) {
	t.Helper()
	if len(ticks) == 0 {
		t.Errorf("%s: no tick enqueued", name)
		return
	}
	slices.Sort(ticks)
	if c := slices.Compact(slices.Clone(ticks)); len(c) != len(ticks) {
		t.Errorf("%s: duplicate ticks in %v", name, ticks)
		return
	}
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	var want []int64
	for n := time.Unix(ticks[0], 0).UTC(); !n.After(time.Unix(ticks[len(ticks)-1], 0)); n = sched.Next(n) {
		want = append(want, n.Unix())
	}
	if !slices.Equal(ticks, want) {
		t.Errorf("%s: ticks %v, want %v", name, ticks, want)
	}
}

// checkOutput asserts the header: the Redis, one /metrics URL per role, the
// end and the check.
func checkOutput(t *testing.T, stdout, redisKind string) {
	t.Helper()
	for _, want := range []string{
		"Lockstep local run: " + redisKind,
		"2 scheduler replicas, 3 workers",
		"check ok:",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	urls := regexp.MustCompile(`(?m)^  (scheduler-[12]|worker-[123]) +http://127\.0\.0\.1:\d+/metrics$`).FindAllStringSubmatch(stdout, -1)
	if len(urls) != 5 {
		t.Errorf("%d /metrics URLs, want 5 (2 schedulers, 3 workers)", len(urls))
	}
}

// SIGINT stops the run cleanly: exit 0, after the check.
func TestInterrupt(t *testing.T) {
	embeddedRedis(t)
	var out, errOut buffer
	code := make(chan int, 1)
	go func() { code <- runMain(configArgs("--every", "500ms"), &out, &errOut) }()
	redistest.WaitFor(t, 30*time.Second, "a line of ticks on stdout", func() bool { return strings.Contains(out.String(), "] ticks ") })
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit status %d, want 0\nstdout:\n%s\nstderr:\n%s", c, out.String(), errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGINT\nstdout:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "stopping (interrupted)") || !strings.Contains(out.String(), "check ok:") {
		t.Errorf("stdout:\n%s", out.String())
	}
}

// With LOCKSTEP_REDIS_ADDR the run uses that Redis, which keeps what the run
// left: one task per tick the replicas enqueued.
func TestRunRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv(envRedisAddr, srv.Addr)
	var out, errOut buffer
	var enqueued int
	code := run(t.Context(), configArgs("--duration", "4s", "--every", "1s"), &out, &errOut, hooks{
		afterStop: func(_ context.Context, _ redis.UniversalClient, res result) { enqueued = total(res.final.enqueued) },
	})
	t.Logf("stdout:\n%s", out.String())
	if code != 0 {
		t.Fatalf("exit status %d, want 0\nstderr:\n%s", code, errOut.String())
	}
	checkOutput(t, out.String(), "Redis at "+srv.Addr)
	q, err := asynq.NewInspectorFromRedisClient(srv.Client()).GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	n := q.Pending + q.Active + q.Scheduled + q.Retry + q.Archived + q.Completed
	if enqueued == 0 || n != enqueued {
		t.Errorf("Redis holds %d tasks, the replicas enqueued %d", n, enqueued)
	}
}

// The embedded Redis counts TTLs down in real time: a lease that nobody
// renews expires, and the next holder gets a higher fence.
func TestEmbeddedExpires(t *testing.T) {
	e, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c := redis.NewClient(&redis.Options{Addr: e.Addr()})
	defer c.Close()
	ctx := t.Context()
	l := lock.New(c)
	const ttl = 300 * time.Millisecond
	// The key is set after the call is sent: its TTL runs from no earlier
	// than this, however late the reply comes.
	acquired := time.Now()
	first, err := l.TryAcquire(ctx, "lock:order:x", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "lock:order:x", ttl); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second acquire at once: %v, want ErrNotAcquired", err)
	}
	var second *lock.Lease
	redistest.WaitFor(t, 5*time.Second, "the lock free again after its TTL", func() bool {
		second, err = l.TryAcquire(ctx, "lock:order:x", ttl)
		return err == nil
	})
	if took := time.Since(acquired); took < ttl-clockStep || took > ttl+500*time.Millisecond {
		t.Errorf("the lease expired after %v, want about %v", took, ttl)
	}
	if second.Fence() <= first.Fence() {
		t.Errorf("fence %d after %d, want higher", second.Fence(), first.Fence())
	}
	if err := first.Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("renewing the expired lease: %v, want ErrLockLost", err)
	}
	if err := second.Release(ctx); err != nil {
		t.Error(err)
	}
}

// Bad flags and configurations exit with 2, before anything starts.
func TestBadConfig(t *testing.T) {
	embeddedRedis(t)
	for name, args := range map[string][]string{
		"every":       configArgs("--every", "0s"),
		"argument":    configArgs("extra"),
		"no file":     {"--scheduler-config", "nonexistent.yaml", "--worker-config", workerConfig},
		"worker file": {"--scheduler-config", schedulerConfig, "--worker-config", "nonexistent.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut buffer
			if code := run(t.Context(), args, &out, &errOut, hooks{}); code != 2 {
				t.Errorf("exit status %d, want 2; stderr: %s", code, errOut.String())
			}
			if out.String() != "" {
				t.Errorf("stdout: %s", out.String())
			}
		})
	}
}
