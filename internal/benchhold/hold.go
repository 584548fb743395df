// Package benchhold is the hold of the contended benchmarks' holders: the
// time a holder keeps a lock or permit before it releases it.
//
// A benchmark that holds with time.Sleep measures Go's timer beside the
// lock. The runtime waits for its timers in epoll_wait, whose timeout is in
// whole milliseconds, and it rounds a remainder under one millisecond up to
// one (netpoll in Go's runtime, on Linux). Each network event that wakes the
// poller during a sleep leaves such a remainder, so a 1 ms sleep lasts
// longer the more traffic the process has beside it: 1.25 ms with one
// holder of 16 contenders and 1.55 ms with four, in the same run. That
// difference is the timer's, not the lock's, yet it counts as the lock's
// when acquisitions per second at limit 4 are compared with limit 1.
//
// On Linux, Hold waits on a timerfd through the runtime's poller instead:
// the kernel's timer wakes the poller when it fires, whatever timeout the
// runtime gave epoll_wait, so a hold lasts d and the kernel's timer slack
// (about 1.07 ms for 1 ms) at any traffic, and the goroutine waits parked,
// its thread free, as a handler waiting on I/O would.
// LOCKSTEP_BENCH_HOLD=sleep makes it time.Sleep, to see the timer's effect.
package benchhold

import (
	"os"
	"time"
)

// Hold blocks the calling goroutine for d.
func Hold(d time.Duration) {
	if useSleep {
		time.Sleep(d)
		return
	}
	timerSleep(d)
}

// Mode names the hold in benchmark output: "timerfd" or "time.Sleep".
func Mode() string {
	if useSleep {
		return "time.Sleep"
	}
	return holdMode
}

var useSleep = os.Getenv("LOCKSTEP_BENCH_HOLD") == "sleep"
