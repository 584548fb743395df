package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
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
