package proctest

import (
	"syscall"
	"testing"
	"time"
)

// SelfCPU is the CPU time (user + system) the test process has used so far:
// what benchmarks take the difference of to report the client's own cost.
func SelfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
