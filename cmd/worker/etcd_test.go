package main

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// With lock.backend etcd the worker binary runs the demo's jobs under etcd
// locks (fences are the keys' create revisions, so they increase), deleting
// a held key in etcd ends that run at once, and /readyz says when etcd
// cannot be reached.
func TestEtcdBackendWorker(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), defaultTTLYAML)
	ec := etcdtest.Start(t)
	w := r.start(bins["worker"], []string{
		"LOCKSTEP_LOCK_BACKEND=etcd",
		"LOCKSTEP_LOCK_ETCD_ENDPOINTS=" + strings.Join(ec.Endpoints(), ","),
	})
	addr := w.httpAddr()

	for i := range 3 {
		r.enqueueDemo(fmt.Sprint("e", i), "etcd", 50)
	}
	r.waitCompleted(3, 20*time.Second)
	execs := readExecutions(t, r.admin)
	for _, err := range demo.Overlaps(execs) {
		t.Error(err)
	}
	if len(execs) != 3 {
		t.Fatalf("%d executions, want 3", len(execs))
	}

	// A held key deleted in etcd: the run ends lock_lost within a second
	// (the back end's watch), under the default 30s TTL.
	r.enqueueDemo("e-del", "etcd-del", 8000)
	fence := w.started("e-del", 10*time.Second)
	cl := ec.Client()
	defer cl.Close()
	deleted := time.Now()
	if _, err := cl.Delete(context.Background(), "lockstep:{lock:order:etcd-del}"); err != nil {
		t.Fatal(err)
	}
	lost := r.ended(fence, 5*time.Second)
	if took := time.Duration(lost.FinishedMS-deleted.UnixMilli()) * time.Millisecond; lost.Outcome != demo.OutcomeLockLost || took > time.Second {
		t.Fatalf("run ended %q %v after the deletion, want lock_lost within 1s", lost.Outcome, took)
	}
	r.waitCompleted(4, 20*time.Second)

	ready := func() int {
		_, code := get("http://"+addr+"/readyz", 5*time.Second)
		return code
	}
	if code := ready(); code != http.StatusOK {
		t.Fatalf("/readyz = %d with etcd up", code)
	}
	ec.Members[0].Kill()
	waitFor(t, 10*time.Second, "/readyz to report etcd down", func() bool { return ready() == http.StatusServiceUnavailable })
}

// One back end per key prefix: beside a worker whose locks are on Redis, a
// worker started with lock.backend etcd on the same prefix refuses to start
// (exit 2, naming both back ends), and the other way round on another
// prefix; each start log names its back end.
func TestOneBackEndPerPrefix(t *testing.T) {
	t.Parallel()
	r := newRig(t, redistest.Start(t), defaultTTLYAML)
	ec := etcdtest.Start(t)
	etcd := []string{"LOCKSTEP_LOCK_BACKEND=etcd", "LOCKSTEP_LOCK_ETCD_ENDPOINTS=" + strings.Join(ec.Endpoints(), ",")}
	refused := func(env []string, want ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a worker that starts is killed
		defer cancel()
		cmd := exec.CommandContext(ctx, bins["worker"], "--config", r.cfg)
		cmd.Env = append(slices.Clip(r.env), env...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Fatalf("a worker of another back end on a served prefix: %v, want exit 2; stderr: %s", err, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		t.Logf("refused: %s", lines[len(lines)-1])
		for _, w := range want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("stderr %q does not name %q", stderr.String(), w)
			}
		}
	}

	w := r.worker()
	w.waitLog(10*time.Second, "the worker to run on redis", proctest.Msg("lockstep worker running", "lock_backend", "redis"))
	refused(etcd, "lock.backend: etcd", "lock.backend redis already serves", `"lockstep:"`)

	other := append(slices.Clip(etcd), "LOCKSTEP_LOCK_PREFIX=other:")
	e := r.start(bins["worker"], other)
	e.waitLog(10*time.Second, "the worker to run on etcd", proctest.Msg("lockstep worker running", "lock_backend", "etcd"))
	refused([]string{"LOCKSTEP_LOCK_PREFIX=other:"}, "lock.backend: redis", "lock.backend etcd already serves", `"other:"`)
}
