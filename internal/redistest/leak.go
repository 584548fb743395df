package redistest

import "go.uber.org/goleak"

// LeakOptions are the goleak options for tests that talk to Redis. After a
// failed dial, go-redis starts a prober that sleeps a second between tries
// and returns once it sees its client closed; a test that killed a server
// can end inside that second. The prober ends on its own, so it is not a leak.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	}
}
