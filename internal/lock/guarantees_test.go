package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// The lock guarantees (G3 no overlap, G5 fences increase, a stale token
// touches nothing) are checked by the bodies below on every kind of
// deployment: one server, a Redis Cluster, Redlock over independent masters
// and etcd. Each body uses its own resource, so one deployment serves them all.

// deployment is what a guarantee check needs from a deployment.
type deployment struct {
	// locker makes a new Locker on the deployment, as another process would.
	locker func(opts ...lock.Option) *lock.Locker
	// admin are clients for the test's own commands: one for a server or a
	// Cluster, every node for Redlock; none for etcd (see store).
	admin []redis.UniversalClient
	// store reads and writes lock keys as another holder (or an operator)
	// would, on every node.
	store store
	// stolen is the reason a renewal gives when another token holds the key
	// (on every node).
	stolen lock.Reason
}

// store is the test's own access to lock keys.
type store interface {
	// overwrite sets key to value for ttl, as another holder would.
	overwrite(t *testing.T, key, value string, ttl time.Duration)
	// get returns key's value on every node ("" where it is absent).
	get(t *testing.T, key string) []string
	// ttl returns key's time to live on every node.
	ttl(t *testing.T, key string) []time.Duration
}

// redisStore is store on Redis nodes.
type redisStore []redis.UniversalClient

func (r redisStore) overwrite(t *testing.T, key, value string, ttl time.Duration) {
	t.Helper()
	for i, c := range r {
		if err := c.Set(context.Background(), key, value, ttl).Err(); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
}

func (r redisStore) get(t *testing.T, key string) []string {
	out := make([]string, len(r))
	for i, c := range r {
		out[i] = c.Get(context.Background(), key).Val()
	}
	return out
}

func (r redisStore) ttl(t *testing.T, key string) []time.Duration {
	out := make([]time.Duration, len(r))
	for i, c := range r {
		out[i] = c.PTTL(context.Background(), key).Val()
	}
	return out
}

func singleServer(t *testing.T) deployment {
	srv := redistest.Start(t)
	c := srv.Client(func(o *redis.Options) { o.PoolSize = 64 })
	return deployment{
		locker: func(opts ...lock.Option) *lock.Locker { return lock.New(c, opts...) },
		admin:  []redis.UniversalClient{c},
		store:  redisStore{c},
		stolen: lock.ReasonStolen,
	}
}

func clusterDeployment(t *testing.T) (deployment, *redistest.Cluster) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(func(o *redis.ClusterOptions) { o.PoolSize = 64 })
	return deployment{
		locker: func(opts ...lock.Option) *lock.Locker { return lock.New(c, opts...) },
		admin:  []redis.UniversalClient{c},
		store:  redisStore{c},
		stolen: lock.ReasonStolen,
	}, cl
}

// redlockNodes starts n independent masters and returns a client for each,
// with the settings a Redlock node wants: short dials, no retries, context
// deadlines on every call.
func redlockNodes(t *testing.T, n int) ([]*redistest.Server, []redis.UniversalClient) {
	t.Helper()
	servers := redistest.StartN(t, n)
	clients := make([]redis.UniversalClient, n)
	for i, s := range servers {
		clients[i] = s.Client(func(o *redis.Options) {
			o.PoolSize = 32
			o.MaxRetries = -1
			o.DialTimeout = 100 * time.Millisecond
			o.ContextTimeoutEnabled = true
		})
	}
	return servers, clients
}

func redlockDeployment(t *testing.T, n int) deployment {
	_, clients := redlockNodes(t, n)
	return deployment{
		locker: func(opts ...lock.Option) *lock.Locker { return lock.NewRedlock(clients, opts...) },
		admin:  clients,
		store:  redisStore(clients),
		stolen: lock.ReasonQuorumLost,
	}
}

// checkContention runs workers goroutines that each take and release the lock
// on one resource perWorker times, and checks that no two ever held it at
// once and that fences strictly increase in the order holders got it.
func checkContention(t *testing.T, d deployment, workers, perWorker int) {
	t.Helper()
	l := d.locker()
	ctx := context.Background()
	var (
		holders  atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		fences   []int64 // in the order holders got the lock
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range perWorker {
				lease, err := l.Acquire(ctx, "hot", 5*time.Second,
					lock.WithWaitBackoff(backoff.Jitter{Min: 50 * time.Microsecond, Max: 2 * time.Millisecond}))
				if err != nil {
					errs <- err
					return
				}
				if holders.Add(1) != 1 {
					overlaps.Add(1)
				}
				mu.Lock()
				fences = append(fences, lease.Fence())
				mu.Unlock()
				holders.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d overlapping holds", n)
	}
	if len(fences) != workers*perWorker {
		t.Fatalf("got %d acquisitions, want %d", len(fences), workers*perWorker)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d = %d after %d: not strictly increasing", i, fences[i], fences[i-1])
		}
	}
}

// checkWrongToken overwrites a held lock with another token, as a new holder
// would after expiry, and checks that the old holder can neither renew nor
// release it.
func checkWrongToken(t *testing.T, d deployment) {
	t.Helper()
	l := d.locker()
	ctx := context.Background()
	holder, err := l.TryAcquire(ctx, "wrong-token", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d.store.overwrite(t, holder.RedisKey(), "someone-else", 2*time.Second)
	err = holder.Renew(ctx)
	var lost *lock.LostError
	if !errors.As(err, &lost) || lost.Reason != d.stolen || !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Renew with a stale token: %v, want ErrLockLost (%s)", err, d.stolen)
	}
	for i, ttl := range d.store.ttl(t, holder.RedisKey()) {
		if ttl > 2*time.Second {
			t.Fatalf("node %d: Renew extended another holder's lock: TTL %v", i, ttl)
		}
	}
	if err := holder.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release with a stale token: %v, want ErrLockLost", err)
	}
	for i, got := range d.store.get(t, holder.RedisKey()) {
		if got != "someone-else" {
			t.Fatalf("node %d: Release deleted another holder's lock: key holds %q", i, got)
		}
	}
}

// checkStaleHolder lets a holder's lease expire unrenewed, as a paused holder
// would, lets another take the lock, and checks that the stale holder's late
// Renew and Release fail with ErrLockLost, leave the next holder's lock alone
// and answer at once from then on.
func checkStaleHolder(t *testing.T, d deployment, ttl time.Duration) {
	t.Helper()
	l := d.locker()
	ctx := context.Background()
	first, err := l.TryAcquire(ctx, "stale", ttl)
	if err != nil {
		t.Fatal(err)
	}
	second, err := d.locker().Acquire(ctx, "stale", time.Minute, lock.MaxWait(10*ttl+5*time.Second),
		lock.WithWaitBackoff(backoff.Jitter{Min: 5 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err != nil {
		t.Fatalf("acquire after the first lease expired: %v", err)
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence after expiry %d <= %d", second.Fence(), first.Fence())
	}
	if err := first.Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Renew: %v, want ErrLockLost", err)
	}
	if err := first.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Release: %v, want ErrLockLost", err)
	}
	for i, got := range d.store.get(t, second.RedisKey()) {
		if got != second.Token() {
			t.Fatalf("node %d: the stale holder touched the next holder's lock: key holds %q", i, got)
		}
	}
	start := time.Now()
	for range 3 {
		if err := first.Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Renew after loss: %v", err)
		}
		if err := first.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Release after loss: %v", err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("calls after loss took %v: they should not reach the store", d)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkFenceAcrossExpiry lets the fencing counter expire and checks that a
// new Locker still hands out a greater fence: a fresh counter starts at the
// server's time in microseconds.
func checkFenceAcrossExpiry(t *testing.T, d deployment) {
	t.Helper()
	ctx := context.Background()
	l1 := d.locker(lock.WithFenceTTL(100 * time.Millisecond))
	var last int64
	for i := range 3 {
		lease, err := l1.TryAcquire(ctx, "fence-expiry", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if lease.Fence() <= last {
			t.Fatalf("acquire %d: fence %d <= %d", i, lease.Fence(), last)
		}
		last = lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Duration(last) * time.Microsecond; d < time.Duration(time.Now().Add(-time.Hour).UnixMicro())*time.Microsecond {
		t.Fatalf("a fresh counter started at %d, want the server's time in microseconds", last)
	}
	eventually(t, 2*time.Second, "the fence counter to expire", func() bool {
		for _, c := range d.admin {
			if c.Exists(ctx, l1.FenceKey("fence-expiry")).Val() != 0 {
				return false
			}
		}
		return true
	})
	lease, err := d.locker().TryAcquire(ctx, "fence-expiry", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Fence() <= last {
		t.Fatalf("fence after the counter expired: %d <= %d", lease.Fence(), last)
	}
}

func TestGuaranteesOnCluster(t *testing.T) {
	t.Parallel()
	d, _ := clusterDeployment(t)
	t.Run("contention", func(t *testing.T) { t.Parallel(); checkContention(t, d, 16, 100) })
	t.Run("wrong token", func(t *testing.T) { t.Parallel(); checkWrongToken(t, d) })
	t.Run("fence across expiry", func(t *testing.T) { t.Parallel(); checkFenceAcrossExpiry(t, d) })
	t.Run("stale holder", func(t *testing.T) { t.Parallel(); checkStaleHolder(t, d, 100*time.Millisecond) })
}

func TestGuaranteesOnRedlock(t *testing.T) {
	t.Parallel()
	d := redlockDeployment(t, 5)
	t.Run("contention", func(t *testing.T) { t.Parallel(); checkContention(t, d, 8, 50) })
	t.Run("wrong token", func(t *testing.T) { t.Parallel(); checkWrongToken(t, d) })
	t.Run("fence across expiry", func(t *testing.T) { t.Parallel(); checkFenceAcrossExpiry(t, d) })
	t.Run("stale holder", func(t *testing.T) { t.Parallel(); checkStaleHolder(t, d, 100*time.Millisecond) })
}
