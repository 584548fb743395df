package lock_test

import (
	"cmp"
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
	// staleTTL is the stale holder's lease (checkStaleHolder); 0: 100ms.
	staleTTL time.Duration
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
	return redisDeployment(redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize = 64 }))
}

func clusterDeployment(t *testing.T) deployment {
	return redisDeployment(redistest.StartCluster(t, 3).Client(func(o *redis.ClusterOptions) { o.PoolSize = 64 }))
}

// redisDeployment is a deployment on one Redis server or one Cluster, through c.
func redisDeployment(c redis.UniversalClient) deployment {
	return deployment{
		locker: func(opts ...lock.Option) *lock.Locker { return lock.New(c, opts...) },
		admin:  []redis.UniversalClient{c},
		store:  redisStore{c},
		stolen: lock.ReasonStolen,
	}
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
		// Five nodes answering under a loaded make test: a node's part
		// bounded by 250ms, not by the 50ms a 100ms lease derives (three
		// nodes timed out at once in one run), and a stale lease of 1s that
		// outlives such an acquire.
		locker: func(opts ...lock.Option) *lock.Locker {
			return lock.NewRedlock(clients, append([]lock.Option{lock.WithNodeTimeout(250 * time.Millisecond)}, opts...)...)
		},
		admin:    clients,
		store:    redisStore(clients),
		stolen:   lock.ReasonQuorumLost,
		staleTTL: time.Second,
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
	together(t, workers, func(int) error {
		for range perWorker {
			lease, err := l.Acquire(ctx, "hot", 5*time.Second,
				lock.WithWaitBackoff(backoff.Jitter{Min: 50 * time.Microsecond, Max: 2 * time.Millisecond}))
			if err != nil {
				return err
			}
			if holders.Add(1) != 1 {
				overlaps.Add(1)
			}
			mu.Lock()
			fences = append(fences, lease.Fence())
			mu.Unlock()
			holders.Add(-1)
			if err := lease.Release(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d overlapping holds", n)
	}
	if len(fences) != workers*perWorker {
		t.Fatalf("got %d acquisitions, want %d", len(fences), workers*perWorker)
	}
	checkIncreasing(t, "", fences)
}

// together runs f in n goroutines at once (g is each one's number) and
// fails the test with an error any of them returned.
func together(t *testing.T, n int, f func(g int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Go(func() {
			if err := f(g); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// checkIncreasing fails unless fences strictly increase; what prefixes
// the failure.
func checkIncreasing(t *testing.T, what string, fences []int64) {
	t.Helper()
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("%sfence %d = %d after %d: not strictly increasing", what, i, fences[i], fences[i-1])
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
	holder := mustAcquire(t, ctx, l, "wrong-token", time.Minute)
	d.store.overwrite(t, holder.RedisKey(), "someone-else", 2*time.Second)
	err := holder.Renew(ctx)
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
	first := mustAcquire(t, ctx, l, "stale", ttl)
	second, err := d.locker().Acquire(ctx, "stale", time.Minute, lock.MaxWait(10*ttl+5*time.Second),
		lock.WithWaitBackoff(backoff.Jitter{Min: 5 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err != nil {
		t.Fatalf("acquire after the first lease expired: %v", err)
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence after expiry %d <= %d", second.Fence(), first.Fence())
	}
	// On Redlock the next holder may hold a majority only (a node where the
	// first lease had not yet expired): what it holds must stay as it is.
	before := d.store.get(t, second.RedisKey())
	held := 0
	for _, got := range before {
		if got == second.Token() {
			held++
		}
	}
	if held <= len(before)/2 {
		t.Fatalf("the next holder holds %d of %d nodes: %q", held, len(before), before)
	}
	if err := first.Renew(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Renew: %v, want ErrLockLost", err)
	}
	if err := first.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("late Release: %v, want ErrLockLost", err)
	}
	for i, got := range d.store.get(t, second.RedisKey()) {
		if before[i] == second.Token() && got != before[i] {
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
		// the counter lives the lock's ttl + the fence TTL: 300ms
		lease := mustAcquire(t, ctx, l1, "fence-expiry", 200*time.Millisecond)
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
	eventually(t, 2*time.Second, "the fence counter and floor to expire", func() bool {
		for _, c := range d.admin {
			if c.Exists(ctx, l1.FenceKey("fence-expiry"), l1.FenceFloorKey("fence-expiry")).Val() != 0 {
				return false
			}
		}
		return true
	})
	lease := mustAcquire(t, ctx, d.locker(), "fence-expiry", time.Minute)
	if lease.Fence() <= last {
		t.Fatalf("fence after the counter expired: %d <= %d", lease.Fence(), last)
	}
}

// checkReentrancy takes resource as owner-a twice, the second time through
// inner (l itself, or another Locker as another process of the same owner
// would), and checks that the inner hold shares the outer's token and fence,
// that another owner and an ownerless caller stay out until every hold is
// released, that nothing of the lock is left then, and that the next holder
// gets a greater fence and keeps the former owner out. It returns the outer
// and the next holder's leases.
func checkReentrancy(t *testing.T, d deployment, l, inner *lock.Locker, resource string, ttl time.Duration) (outer, next *lock.Lease) {
	t.Helper()
	ctx := context.Background()
	mine := lock.WithOwner(ctx, "owner-a")
	theirs := lock.WithOwner(ctx, "owner-b")
	outer = mustAcquire(t, mine, l, resource, ttl)
	held, err := inner.TryAcquire(mine, resource, ttl)
	if err != nil {
		t.Fatalf("reentrant acquire: %v", err)
	}
	if !held.Reentrant() || held.Fence() != outer.Fence() || held.Token() != outer.Token() {
		t.Fatalf("inner lease: reentrant=%v fence %d/%d: want the outer hold's token and fence",
			held.Reentrant(), held.Fence(), outer.Fence())
	}
	for i, c := range d.admin {
		if n := c.HGet(ctx, l.Key(resource)+":owners", "o:owner-a").Val(); n != "2" {
			t.Fatalf("node %d: hold count %q, want 2", i, n)
		}
	}
	for who, c := range map[string]context.Context{"other owner": theirs, "no owner": ctx} {
		if _, err := l.TryAcquire(c, resource, ttl); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("%s: %v, want ErrNotAcquired", who, err)
		}
	}
	if err := held.Renew(ctx); err != nil {
		t.Fatalf("renew the inner hold: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(theirs, resource, ttl); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("other owner with one hold left: %v, want ErrNotAcquired", err)
	}
	if err := outer.Renew(ctx); err != nil {
		t.Fatalf("renew the outer hold: %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range d.admin {
		if n := c.Exists(ctx, l.Key(resource)).Val(); n != 0 {
			t.Fatalf("node %d kept the lock after every hold was released", i)
		}
	}
	next, err = l.TryAcquire(theirs, resource, ttl)
	if err != nil {
		t.Fatalf("other owner after every hold was released: %v", err)
	}
	if next.Fence() <= outer.Fence() {
		t.Fatalf("fence %d <= %d", next.Fence(), outer.Fence())
	}
	if _, err := l.TryAcquire(mine, resource, ttl); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("former owner re-entered someone else's lock: %v", err)
	}
	return outer, next
}

// checkGuarantees runs the guarantee bodies on d as parallel subtests, the
// contention one with workers goroutines of perWorker cycles each.
func checkGuarantees(t *testing.T, d deployment, workers, perWorker int) {
	t.Helper()
	t.Run("contention", func(t *testing.T) { t.Parallel(); checkContention(t, d, workers, perWorker) })
	t.Run("wrong token", func(t *testing.T) { t.Parallel(); checkWrongToken(t, d) })
	t.Run("fence across expiry", func(t *testing.T) { t.Parallel(); checkFenceAcrossExpiry(t, d) })
	t.Run("stale holder", func(t *testing.T) { t.Parallel(); checkStaleHolder(t, d, cmp.Or(d.staleTTL, 100*time.Millisecond)) })
}

func TestGuaranteesOnOneServer(t *testing.T) {
	t.Parallel()
	checkGuarantees(t, singleServer(t), 16, 200)
}

func TestGuaranteesOnCluster(t *testing.T) {
	t.Parallel()
	checkGuarantees(t, clusterDeployment(t), 16, 100)
}

func TestGuaranteesOnRedlock(t *testing.T) {
	t.Parallel()
	checkGuarantees(t, redlockDeployment(t, 5), 8, 50)
}
