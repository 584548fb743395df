// Package exampletest runs the example services of examples/ as their users
// would: built from their own modules (Lockstep's scheduler and lockstep
// command too, as the modules' tools), against a private Redis and
// PostgreSQL.
package exampletest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// orders is the example service's module directory.
const orders = "../../examples/orders"

// bins holds the binaries built from the example's module: its own
// orders-worker and orders-enqueue, and Lockstep's scheduler and lockstep
// command, its tools.
var bins = map[string]string{}

func TestMain(m *testing.M) {
	dir, err := proctest.MkdirTemp("lockstep-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if err := build(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		code := sqltest.Main(m).Run()
		if code == 0 {
			if err := goleak.Find(redistest.LeakOptions()...); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// build builds the example's binaries from its own module, as its users
// do: go build in its directory, Lockstep resolved through its go.mod.
func build(dir string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	pkgs := []string{"./cmd/orders-worker", "./cmd/orders-enqueue",
		"github.com/lockstep-dev/lockstep/cmd/scheduler", "github.com/lockstep-dev/lockstep/cmd/lockstep"}
	args := append(append([]string{"build", "-o", dir + string(filepath.Separator)}, raceFlags...), pkgs...)
	cmd := exec.Command(goTool, args...)
	cmd.Dir = orders
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build in %s: %v\n%s", orders, err, out)
	}
	for _, p := range pkgs {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return nil
}

// proc is one process of the example and its JSON log.
type proc struct {
	*proctest.Proc
	log proctest.Log
}

func start(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{}
	p.Proc = proctest.New(t, proctest.Spec{What: filepath.Base(bin), Bin: bin, Args: args, Output: &p.log,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...)})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", filepath.Base(bin), p.log.Tail(3000))
		}
	})
	return p
}

// The example service runs as its quick start says: two of its own workers,
// Lockstep's scheduler with its schedules, its enqueuer as application code.
// Every order is paid once, under its lock, with a fence that its own
// PostgreSQL recorded; a duplicate request is refused by its task id; the
// schedule's ticks pay the subscription once; asynq's own Inspector finds
// nothing failed; the lockstep command reads the locks.
func TestOrdersService(t *testing.T) {
	ctx := context.Background()
	rs := redistest.Start(t)
	db := sqltest.Postgres(t)
	env := []string{"LOCKSTEP_REDIS_ADDR=" + rs.Addr, "LOCKSTEP_HTTP_ADDR=127.0.0.1:0", "ORDERS_DATABASE_URL=" + db.DSN}
	workerConfig := filepath.Join(orders, "configs", "worker.yaml")
	var workers []*proc
	for range 2 {
		w := start(t, bins["orders-worker"], env, "--config", workerConfig)
		w.log.Wait(t, 0, 30*time.Second, w.Exited(), "the worker to run", proctest.Msg("lockstep worker running"))
		workers = append(workers, w)
	}
	sched := start(t, bins["scheduler"], env[:2], "--config", filepath.Join(orders, "configs", "scheduler.yaml"))
	sched.log.Wait(t, 0, 30*time.Second, sched.Exited(), "the scheduler to run", proctest.Msg("lockstep scheduler running"))

	var want []string
	args := []string{"--redis", rs.Addr}
	for i := range 20 {
		id := fmt.Sprintf("o%02d", i)
		want = append(want, id)
		args = append(args, fmt.Sprintf("%s:%d", id, 100+i))
	}
	args = append(args, "o03:999") // the same order again: refused by its task id
	out, err := exec.Command(bins["orders-enqueue"], args...).CombinedOutput()
	if err != nil {
		t.Fatalf("orders-enqueue: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pay:o03 already queued") || strings.Count(string(out), "\n") != 21 {
		t.Fatalf("orders-enqueue printed:\n%s\nwant 20 task ids and pay:o03 already queued", out)
	}
	want = append(want, "subscription-7")

	type payment struct {
		amount int64
		fence  int64
	}
	paid := map[string]payment{}
	redistest.WaitFor(t, 60*time.Second, "every order and the subscription paid", func() bool {
		rows, err := db.QueryContext(ctx, `SELECT order_id, amount_cents, fence FROM payments`)
		if err != nil {
			return false
		}
		defer rows.Close()
		clear(paid)
		for rows.Next() {
			var id string
			var p payment
			if rows.Scan(&id, &p.amount, &p.fence) == nil {
				paid[id] = p
			}
		}
		return len(paid) == len(want)
	})
	for i, id := range want[:20] {
		if p := paid[id]; p.amount != int64(100+i) {
			t.Errorf("order %s paid %d, want %d (the first request's amount)", id, p.amount, 100+i)
		}
	}
	// Each payment committed with the fence its order's lock had, which the
	// fence table recorded in the same transaction.
	for id, p := range paid {
		var recorded int64
		if err := db.QueryRowContext(ctx, `SELECT fence FROM lockstep_fences WHERE resource = $1 AND permit = 0`, "order:"+id).Scan(&recorded); err != nil {
			t.Fatalf("the fence of order:%s: %v", id, err)
		}
		if p.fence <= 0 || p.fence > recorded {
			t.Errorf("order %s paid with fence %d, the table recorded %d", id, p.fence, recorded)
		}
	}

	// The scheduler's ticks kept coming; stop it, let the workers drain,
	// and ask asynq itself.
	if code, _ := sched.Term(10 * time.Second); code != 0 {
		t.Errorf("scheduler exited %d on SIGTERM", code)
	}
	insp := asynq.NewInspectorFromRedisClient(rs.Client())
	defer insp.Close()
	redistest.WaitFor(t, 30*time.Second, "the default queue to drain", func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Pending+q.Active+q.Scheduled+q.Retry == 0
	})
	if q, _ := insp.GetQueueInfo("default"); q.Archived != 0 || q.Failed != 0 {
		t.Errorf("asynq's queue: %d archived, %d failed today; want none", q.Archived, q.Failed)
	}

	// The lockstep command, built from the service's module, reads the
	// locks: none is left (exit 1, "not found", with an empty list).
	cmd := exec.Command(bins["lockstep"], "locks", "--json")
	cmd.Env = append(os.Environ(), "LOCKSTEP_REDIS_ADDR="+rs.Addr)
	out, err = cmd.Output()
	var held []map[string]any
	if jerr := json.Unmarshal(out, &held); jerr != nil || len(held) != 0 || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("lockstep locks --json: %q, %v; want an empty list and exit 1 (no lock held)", out, err)
	}
	for _, w := range workers {
		if code, _ := w.Term(15 * time.Second); code != 0 {
			t.Errorf("worker exited %d on SIGTERM", code)
		}
	}
}

// The example's Kubernetes overlay runs the service's worker image with its
// own configuration and schedules, and nothing of the demo.
func TestOrdersOverlayHasNoDemo(t *testing.T) {
	dir := filepath.Join(orders, "deploy")
	var k struct {
		Resources          []string
		ConfigMapGenerator []struct {
			Name     string
			Behavior string
			Files    []string
		} `yaml:"configMapGenerator"`
		Patches []struct {
			Target struct{ Kind, Name string }
			Patch  string
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(k.Resources, "../../../deploy/k8s") {
		t.Errorf("resources %v: want Lockstep's base, ../../../deploy/k8s", k.Resources)
	}
	if _, err := os.Stat(filepath.Join(dir, "../../../deploy/k8s/kustomization.yaml")); err != nil {
		t.Errorf("the base: %v", err)
	}
	loaders := map[string]func(path string) error{
		"lockstep-worker": func(path string) error {
			c, err := config.LoadWorker(path, func(string) (string, bool) { return "", false })
			if err == nil && c.Worker.Demo {
				err = fmt.Errorf("%s: worker.demo is on", path)
			}
			return err
		},
		"lockstep-scheduler": func(path string) error {
			c, err := config.LoadScheduler(path, func(string) (string, bool) { return "", false })
			if err != nil {
				return err
			}
			for _, s := range c.Schedules {
				if strings.HasPrefix(s.Task, "demo:") {
					err = fmt.Errorf("%s: schedule %s runs the demo's %s", path, s.Name, s.Task)
				}
			}
			return err
		},
	}
	for _, g := range k.ConfigMapGenerator {
		load := loaders[g.Name]
		if load == nil || g.Behavior != "replace" || len(g.Files) != 1 {
			t.Errorf("configMapGenerator %+v: want the base's ConfigMaps replaced, one file each", g)
			continue
		}
		if err := load(filepath.Join(dir, g.Files[0])); err != nil {
			t.Error(err)
		}
		delete(loaders, g.Name)
	}
	if len(loaders) != 0 {
		t.Errorf("the overlay keeps the base's ConfigMaps %v (the demo's)", loaders)
	}
	dockerfile, err := os.ReadFile(filepath.Join(orders, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range k.Patches {
		if p.Target.Kind == "Deployment" && p.Target.Name == "lockstep-worker" {
			if !strings.Contains(p.Patch, "value: orders-worker:") || !strings.Contains(p.Patch, `["/usr/local/bin/orders-worker"]`) {
				t.Errorf("the worker's patch does not run the service's image and binary:\n%s", p.Patch)
			}
			if !strings.Contains(string(dockerfile), "/usr/local/bin/orders-worker") {
				t.Error("the example's Dockerfile does not install /usr/local/bin/orders-worker, which the overlay runs")
			}
			return
		}
	}
	t.Error("the overlay does not patch the worker Deployment")
}
