package redistest

import (
	"testing"
	"time"
)

// WaitFor polls cond, an observable fact (a key in Redis, a metric, a task
// state), every 5ms until it holds, and fails the test when timeout passes
// first. It is how tests wait: on an event, with a bound, never a bare sleep.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	WaitEvery(tb, timeout, 5*time.Millisecond, what, cond)
}

// WaitEvery is WaitFor for an observable that is costly to read (a process
// to run, a query API to ask): it polls cond every interval instead.
func WaitEvery(tb testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Within(timeout, interval, cond) {
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Within polls cond every interval until it holds, and reports whether it
// did before timeout passed: for a test that says what it saw when a bound
// is missed, then goes on.
func Within(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

// Receive returns the next value from ch, and fails the test when none comes
// within timeout: how a test waits for what a goroutine sends.
func Receive[T any](tb testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		var zero T
		return zero
	}
}
