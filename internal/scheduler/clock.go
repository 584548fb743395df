package scheduler

import "time"

// Clock is the scheduler's source of time. Ticks fire when Now reaches their
// scheduled time; tests inject a fake clock to skew replicas, stop time across
// an outage or step over a daylight-saving change. Leases, by contrast, are
// measured by Redis's own clock (PX, TIME), so they do not depend on it.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once d has passed on this clock;
	// at once when d <= 0.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// SystemClock is the host's clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time                 { return time.Now() }
func (SystemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }
