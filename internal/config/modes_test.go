package config

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestModeOptions(t *testing.T) {
	t.Parallel()
	sentinel := RedisConfig{
		Mode: RedisSentinel, Addrs: []string{"s1:26379", "s2:26379", "s3:26379"}, MasterName: "mymaster", DB: 2,
		Username: "app", Password: "pw", SentinelUsername: "sentinel-user", SentinelPassword: "spw",
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, PoolSize: 7,
	}
	u, err := sentinel.UniversalOptions()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(u.Addrs, sentinel.Addrs) || u.MasterName != "mymaster" || u.DB != 2 || u.Username != "app" ||
		u.Password != "pw" || u.SentinelUsername != "sentinel-user" || u.SentinelPassword != "spw" || u.PoolSize != 7 ||
		!u.ContextTimeoutEnabled {
		t.Errorf("sentinel UniversalOptions = %+v", u)
	}
	cluster := RedisConfig{Mode: RedisCluster, Addrs: []string{"c1:7000"}, Username: "app", Password: "pw", DialTimeout: time.Second}
	u, err = cluster.UniversalOptions()
	if err != nil {
		t.Fatal(err)
	}
	if !u.IsClusterMode || !reflect.DeepEqual(u.Addrs, []string{"c1:7000"}) || u.MasterName != "" || u.Password != "pw" {
		t.Errorf("cluster UniversalOptions = %+v", u)
	}
	c := redis.NewUniversalClient(u) // one seed address still makes a Cluster client
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Errorf("cluster mode with one seed made a %T", c)
	}
	_ = c.Close()
}

func TestModeSecretsRedacted(t *testing.T) {
	t.Parallel()
	c := loadWorker(t, "redis:\n  mode: sentinel\n  addrs: [s1:26379]\n  master_name: m\n  sentinel_password: "+secret+"\n")
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("loaded", "redis", c.Redis)
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"String": c.Redis.String(), "log": logs.String(), "json": string(js), "%+v": fmt.Sprintf("%+v", c)} {
		if strings.Contains(out, secret) || !strings.Contains(out, redacted) {
			t.Errorf("%s: %s", name, out)
		}
	}
	if got, want := c.Redis.String(), "mode=sentinel addrs=s1:26379 master_name=m db=0 sentinel_password=[redacted] tls=false"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestModeEnvOverrides(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "w.yaml", minimal)
	tests := []override{
		{"cluster, comma list", map[string]string{"LOCKSTEP_REDIS_MODE": "cluster", "LOCKSTEP_REDIS_ADDR": "", "LOCKSTEP_REDIS_ADDRS": "c1:7000, c2:7000,"},
			func(c *WorkerConfig) bool {
				return c.Redis.Mode == RedisCluster && reflect.DeepEqual(c.Redis.Addrs, []string{"c1:7000", "c2:7000"})
			}},
		{"sentinel, JSON list", map[string]string{"LOCKSTEP_REDIS_MODE": "sentinel", "LOCKSTEP_REDIS_ADDR": "",
			"LOCKSTEP_REDIS_ADDRS": `["s1:26379","s2:26379"]`, "LOCKSTEP_REDIS_MASTER_NAME": "m", "LOCKSTEP_REDIS_SENTINEL_PASSWORD": "x"},
			func(c *WorkerConfig) bool {
				return c.Redis.Mode == RedisSentinel && len(c.Redis.Addrs) == 2 && c.Redis.MasterName == "m" && c.Redis.SentinelPassword == "x"
			}},
		{"redlock", map[string]string{"LOCKSTEP_LOCK_BACKEND": "redlock", "LOCKSTEP_LOCK_NODES": "n1:6379,n2:6379,n3:6379,n4:6379,n5:6379",
			"LOCKSTEP_LOCK_NODE_TIMEOUT": "80ms"},
			func(c *WorkerConfig) bool {
				return c.Lock.Backend == BackendRedlock && len(c.Lock.Nodes) == 5 && c.Lock.NodeTimeout == 80*time.Millisecond
			}},
	}
	checkOverrides(t, file, tests)
}

// Each mode, loaded from YAML, reaches a real deployment through both the
// go-redis client and asynq's, and NewLocker takes locks on it.
func TestModesReachRealDeployments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func(t *testing.T, yml string, wantClient string, check func(*lock.Locker, *lock.Lease)) {
		t.Helper()
		c := loadWorker(t, yml)
		opts, err := c.Redis.UniversalOptions()
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewUniversalClient(opts)
		defer client.Close()
		if got := fmt.Sprintf("%T", client); got != wantClient {
			t.Fatalf("client %s, want %s", got, wantClient)
		}
		// asynq runs on the same client (NewClientFromRedisClient), as in the binaries.
		enq := asynq.NewClientFromRedisClient(client)
		if _, err := enq.Enqueue(asynq.NewTask("probe", nil), asynq.Queue("probe")); err != nil {
			t.Fatalf("asynq on this client: %v", err)
		}
		l, closeLocker, err := c.NewLocker(client)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := closeLocker(); err != nil {
				t.Error(err)
			}
		}()
		lease, err := l.TryAcquire(ctx, "probe", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if lease.RedisKey() != c.Lock.Prefix+"{probe}" {
			t.Fatalf("key %q does not use lock.prefix %q", lease.RedisKey(), c.Lock.Prefix)
		}
		check(l, lease)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("single", func(t *testing.T) {
		t.Parallel()
		s := redistest.Start(t)
		run(t, fmt.Sprintf("redis:\n  addr: %s\nlock:\n  prefix: 'single:'\n  fence_ttl: 7s\n", s.Addr), "*redis.Client",
			func(l *lock.Locker, _ *lock.Lease) {
				if l.Quorum() != 1 {
					t.Errorf("quorum %d", l.Quorum())
				}
				// lock.fence_ttl reaches the Locker: the counter outlives the
				// one-minute lock by 7s.
				if pttl := s.Client().PTTL(ctx, l.FenceKey("probe")).Val(); pttl <= time.Minute+6*time.Second || pttl > time.Minute+7*time.Second {
					t.Errorf("fencing counter PTTL %v, want just under 1m7s", pttl)
				}
			})
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		s := redistest.StartSentinel(t)
		run(t, fmt.Sprintf("redis:\n  mode: sentinel\n  addrs: [%s]\n  master_name: %s\nlock:\n  wait_replicas: 1\n  wait_replicas_timeout: 2s\n",
			strings.Join(s.SentinelAddrs(), ", "), s.MasterName), "*redis.Client",
			func(_ *lock.Locker, lease *lock.Lease) {
				// WAIT 1 succeeded, so the replica has the lock.
				if got := s.Replica().Client().Get(ctx, lease.RedisKey()).Val(); got != lease.Token() {
					t.Errorf("replica holds %q, want the token", got)
				}
			})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t, 3)
		run(t, fmt.Sprintf("redis:\n  mode: cluster\n  addrs: [%s]\n", cl.Nodes[1].Addr), "*redis.ClusterClient",
			func(_ *lock.Locker, lease *lock.Lease) {
				if got := cl.NodeFor(lease.RedisKey()).Client().Get(ctx, lease.RedisKey()).Val(); got != lease.Token() {
					t.Errorf("the slot's master holds %q, want the token", got)
				}
			})
	})
	t.Run("redlock", func(t *testing.T) {
		t.Parallel()
		main := redistest.Start(t)
		nodes := redistest.StartN(t, 3)
		addrs := []string{nodes[0].Addr, nodes[1].Addr, nodes[2].Addr}
		run(t, fmt.Sprintf("redis:\n  addr: %s\nlock:\n  backend: redlock\n  nodes: [%s]\n  node_timeout: 200ms\n",
			main.Addr, strings.Join(addrs, ", ")), "*redis.Client",
			func(l *lock.Locker, lease *lock.Lease) {
				if l.Quorum() != 2 || len(l.Nodes()) != 3 {
					t.Errorf("quorum %d of %d nodes, want 2 of 3", l.Quorum(), len(l.Nodes()))
				}
				// The acquire returns once a quorum holds the lock: the third
				// node's answer may still be on its way.
				holding := 0
				for _, n := range nodes {
					if n.Client().Get(ctx, lease.RedisKey()).Val() == lease.Token() {
						holding++
					}
				}
				if holding < l.Quorum() {
					t.Errorf("%d of %d nodes hold the token, want at least the quorum %d", holding, len(nodes), l.Quorum())
				}
				if n := main.Client().Exists(ctx, lease.RedisKey()).Val(); n != 0 {
					t.Error("the redis section's server holds a Redlock lock")
				}
			})
	})
}

// A program that does not link the etcd back end (package etcd) refuses
// lock.backend etcd with an error naming the import, before connecting.
func TestEtcdWithoutItsPackageNamesTheImport(t *testing.T) {
	t.Parallel()
	c := loadWorker(t, "redis: {addr: \"127.0.0.1:1\"}\nlock:\n  backend: etcd\n  etcd:\n    endpoints: [127.0.0.1:1]\n")
	_, _, err := c.NewLocker(nil)
	var ce *Error
	if !errors.As(err, &ce) || ce.Field != "lock.backend" || !strings.Contains(err.Error(), `import _ "github.com/lockstep-dev/lockstep/etcd"`) {
		t.Fatalf("NewLocker without the etcd package: %v, want a lock.backend error naming the import", err)
	}
}

// TestClusterClientFollowsAPromotion kills the master that serves a key and
// waits for the Cluster to promote its replica: the next writes of the
// binaries' Cluster client (NewClient) reach the promoted replica within a
// few seconds of the promotion, not at go-redis's own reread of the slots a
// minute later (the dead master sends no MOVED).
func TestClusterClientFollowsAPromotion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := redistest.StartClusterWithReplicas(t, 3)
	cfg := RedisConfig{Mode: RedisCluster, Addrs: []string{cl.Nodes[0].Addr, cl.Nodes[1].Addr, cl.Nodes[2].Addr},
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond}
	c, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const key = "probe"
	if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m := cl.NodeFor(key)
	replica := cl.Replicas[slices.Index(cl.Nodes, m)]
	m.Kill()
	redistest.WaitFor(t, 20*time.Second, "the replica promoted", func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	})
	promoted := time.Now()
	// Bound: the Cluster's own state settling after the promotion (its
	// other masters learn of it by gossip) and a reread of the slots, with
	// CPU shared; go-redis alone would wait a minute.
	const bound = 8 * time.Second
	var last error
	if !redistest.Within(bound, 50*time.Millisecond, func() bool {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		last = c.Set(wctx, key, "after", 0).Err()
		return last == nil
	}) {
		t.Fatalf("no write reached the promoted replica within %v of its promotion (last: %v)", bound, last)
	}
	t.Logf("a write reached the promoted replica %v after its promotion", time.Since(promoted).Round(time.Millisecond))
	if got := replica.Client().Get(ctx, key).Val(); got != "after" {
		t.Fatalf("the promoted replica holds %q, want the write", got)
	}
}
