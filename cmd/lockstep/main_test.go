package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// bins are the binaries the tests run: this command, a worker and a
// scheduler, built once for the package.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, bins, []string{".", "../worker", "../scheduler"}, etcdtest.LeakOptions()...))
}

// result is what one run of the CLI did.
type result struct {
	code           int
	stdout, stderr string
}

// cli runs the lockstep binary against the Redis at addr.
func cli(t *testing.T, addr string, stdin string, args ...string) result {
	t.Helper()
	var env []string
	if addr != "" {
		env = append(env, "LOCKSTEP_REDIS_ADDR="+addr)
	}
	return cliEnv(t, env, stdin, args...)
}

// cliEnv runs the lockstep binary with only the environment env (and PATH).
func cliEnv(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bins["lockstep"], args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("lockstep %v: %v", args, err)
	}
	return r
}

// cliJSON runs the CLI and decodes its stdout into v, failing unless it
// exited with want.
func cliJSON(t *testing.T, addr string, want int, v any, args ...string) {
	t.Helper()
	r := cli(t, addr, "", args...)
	if r.code != want {
		t.Fatalf("lockstep %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, want, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("lockstep %v: %v\n%s", args, err, r.stdout)
	}
}

// startProc starts one of bins with args and env (and PATH); the process is
// killed at the end of the test, its output shown if the test failed.
func startProc(t *testing.T, name string, env []string, args ...string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, proctest.Spec{What: name, Bin: bins[name], Args: args,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...), Log: filepath.Join(t.TempDir(), name+".log")})
}

const workerYAML = `
http:
  addr: "127.0.0.1:0"
log:
  level: debug
lock:
  ttl: 2s
worker:
  concurrency: 4
  shutdown_timeout: 1s
  contention_backoff_min: 50ms
  contention_backoff_max: 500ms
  demo: true
`

const schedulerYAML = `
http:
  addr: "127.0.0.1:0"
scheduler:
  max_clock_skew: 200ms
  tick_lock_ttl: 1s
schedules:
  - name: every-second
    cron: "* * * * * *"
    task: demo:order.pay
    payload: {"order_id": "tick", "work_ms": 5}
`

// cluster is a Redis with a worker and a scheduler on it.
type cluster struct {
	addr string
	enq  *asynq.Client
}

func startCluster(t *testing.T, srv *redistest.Server) *cluster {
	t.Helper()
	env := []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr}
	startProc(t, "worker", env, "--config", proctest.WriteFile(t, "worker.yaml", workerYAML))
	startProc(t, "scheduler", env, "--config", proctest.WriteFile(t, "scheduler.yaml", schedulerYAML))
	client := srv.Client()
	t.Cleanup(func() { _ = client.Close() })
	return &cluster{addr: srv.Addr, enq: asynq.NewClientFromRedisClient(client)}
}

func (c *cluster) enqueueDemo(t *testing.T, id, order string, workMS int) {
	t.Helper()
	payload := fmt.Sprintf(`{"order_id":%q,"work_ms":%d}`, order, workMS)
	_, err := c.enq.Enqueue(asynq.NewTask(demo.Type, []byte(payload)),
		asynq.TaskID(id), asynq.MaxRetry(5), asynq.Retention(time.Hour), asynq.Queue(demo.Queue))
	if err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
}

// locksOf returns the lock on resource from `lockstep locks --json`, or nil.
func lockOf(t *testing.T, addr, resource string) map[string]any {
	t.Helper()
	r := cli(t, addr, "", "locks", "--json")
	var locks []map[string]any
	if r.code > 1 || json.Unmarshal([]byte(r.stdout), &locks) != nil {
		t.Fatalf("lockstep locks --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, l := range locks {
		if l["resource"] == resource {
			return l
		}
	}
	return nil
}

var waitFor = redistest.WaitFor
