package acltest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// etcdRole is the role docs/operations.md#etcd gives Lockstep: read and
// write on the keys under lock.prefix, nothing else.
const etcdRole = "lockstep"

// TestWorkerOnEtcdWithAuth: on an etcd with authentication enabled, a
// worker whose user has only the documented role (read-write on the prefix
// "lockstep:") runs contended locked jobs to their end, one holder at a
// time; a user with read permission alone locks nothing, and the worker
// says that etcd refused it.
func TestWorkerOnEtcdWithAuth(t *testing.T) {
	t.Parallel()
	ec := etcdtest.Start(t)
	admin := ec.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := admin.RoleAdd(ctx, etcdRole); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, etcdRole, "lockstep:", clientv3.GetPrefixRangeEnd("lockstep:"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.RoleAdd(ctx, "lockstep-read"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "lockstep-read", "lockstep:", clientv3.GetPrefixRangeEnd("lockstep:"), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "lockstep-worker", password("lockstep-worker")); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "lockstep-worker", etcdRole); return err },
		func() error { _, err := admin.UserAdd(ctx, "lockstep-reader", password("lockstep-reader")); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "lockstep-reader", "lockstep-read"); return err },
		func() error { _, err := admin.UserAdd(ctx, "root", password("root")); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("etcd auth setup: %v", err)
		}
	}

	srv := redistest.Start(t)
	c := srv.Client()
	worker := func(user string) *binProc {
		etcdCfg := proctest.WriteFile(t, user+"-etcd.yaml", strings.Replace(workerConfig, "lock:\n  ttl: 1s\n",
			fmt.Sprintf("lock:\n  ttl: 3s\n  backend: etcd\n  etcd:\n    endpoints: [%s]\n    username: %s\n    password_file: %s\n",
				strings.Join(ec.Endpoints(), ", "), user, proctest.WriteFile(t, user+"-password", password(user)+"\n")), 1))
		return startBinary(t, "worker", []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr}, "--config", etcdCfg)
	}

	enq := asynq.NewClientFromRedisClient(srv.Client())
	defer enq.Close()
	enqueue := func(id, order string, workMS int) {
		t.Helper()
		payload := fmt.Sprintf(`{"order_id":%q,"work_ms":%d}`, order, workMS)
		if _, err := enq.Enqueue(asynq.NewTask(demo.Type, []byte(payload)), asynq.Queue(demo.Queue), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}

	// The documented role: contended jobs on one order run one at a time.
	w := worker("lockstep-worker")
	w.metricsAddr(t)
	for i := range 4 {
		enqueue(fmt.Sprintf("auth-%d", i), "auth", 300)
	}
	waitDemoOK(t, c, 4, 60*time.Second)
	execs, err := demo.ReadExecutions(context.Background(), c, "lockstep:")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range demo.Overlaps(execs) {
		t.Error(err)
	}
	if rec := w.log.Find(func(m map[string]any) bool { return strings.Contains(fmt.Sprint(m), "permission denied") }); rec != nil {
		t.Errorf("etcd refused the worker under the documented role: %v", rec)
	}

	// Read permission alone: etcd refuses the lock, and the worker says so.
	r := worker("lockstep-reader")
	r.metricsAddr(t)
	w.Kill()
	enqueue("auth-read", "auth-read", 10)
	refused := r.log.Wait(t, 0, 30*time.Second, r.Exited(), "the worker to say that etcd refused its lock", func(m map[string]any) bool {
		return strings.Contains(fmt.Sprint(m["err"]), "permission denied") && m["id"] == "auth-read"
	})
	t.Logf("under read permission alone: %s: %v", refused["msg"], refused["err"])
	if got := waitDemoOK(t, c, 0, time.Second); got[demo.OutcomeOK] != 4 {
		t.Errorf("%d ok executions after the read-only worker ran, want still 4: it ran a job without its lock", got[demo.OutcomeOK])
	}
}
