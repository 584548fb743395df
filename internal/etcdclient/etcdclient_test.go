package etcdclient_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/config"
	_ "github.com/lockstep-dev/lockstep/internal/etcdclient"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }

// lock.backend etcd, loaded from YAML in a program that links this package,
// takes its locks in the etcd cluster of lock.etcd.endpoints (bare host:port
// gets http://), never in the redis section's server.
func TestConfigEtcdLocksInTheCluster(t *testing.T) {
	ctx := context.Background()
	main := redistest.Start(t)
	cluster := etcdtest.StartCluster(t, 3)
	eps := make([]string, 0, 3)
	for _, ep := range cluster.Endpoints() {
		eps = append(eps, strings.TrimPrefix(ep, "http://"))
	}
	path := filepath.Join(t.TempDir(), "w.yaml")
	yml := fmt.Sprintf("redis:\n  addr: %s\nlock:\n  backend: etcd\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 2s\n", main.Addr, strings.Join(eps, ", "))
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadWorker(path, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	l, closeLocker, err := c.NewLocker(main.Client())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := closeLocker(); err != nil {
			t.Error(err)
		}
	}()
	if l.Backend() != "etcd" {
		t.Errorf("backend %q, want etcd", l.Backend())
	}
	lease, err := l.TryAcquire(ctx, "probe", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if lease.RedisKey() != c.Lock.Prefix+"{probe}" {
		t.Fatalf("key %q does not use lock.prefix %q", lease.RedisKey(), c.Lock.Prefix)
	}
	resp, err := cluster.Client().Get(ctx, lease.RedisKey())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != lease.Token() ||
		resp.Kvs[0].CreateRevision != lease.Fence() {
		t.Errorf("etcd holds %v (%v), want the token with the fence as create revision", resp, err)
	}
	if n := main.Client().Exists(ctx, lease.RedisKey()).Val(); n != 0 {
		t.Error("the redis section's server holds an etcd lock")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
