package lock_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(queueChildEnv) != "" { // this binary run as a waiter process (etcd_queue_test.go)
		os.Exit(queueChild())
	}
	goleak.VerifyTestMain(m, redistest.LeakOptions()...)
}

func newLocker(t testing.TB, opts ...lock.Option) (*lock.Locker, *redis.Client, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c := srv.Client(func(o *redis.Options) { o.PoolSize = 64 })
	return lock.New(c, opts...), c, srv
}

// eventually waits for an observable condition (see redistest.WaitFor).
var eventually = redistest.WaitFor

// newHeld is newLocker with resource held for ttl (the holder that a test's
// waiters queue behind, say).
func newHeld(t testing.TB, resource string, ttl time.Duration, opts ...lock.Option) (*lock.Locker, *redis.Client, *lock.Lease) {
	t.Helper()
	l, c, _ := newLocker(t, opts...)
	return l, c, mustAcquire(t, context.Background(), l, resource, ttl)
}

// mustAcquire takes resource on l for ttl and fails the test when it cannot.
func mustAcquire(t testing.TB, ctx context.Context, l *lock.Locker, resource string, ttl time.Duration) *lock.Lease {
	t.Helper()
	lease, err := l.TryAcquire(ctx, resource, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
