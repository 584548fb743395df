package scheduler

import "time"

// Clock is the scheduler's source of time. Ticks fire when Now reaches their
// scheduled time; tests inject a fake clock to skew replicas, stop time across
// an outage or step over a daylight-saving change. Leases, by contrast, are
// measured by Redis's own clock (PX, TIME), so they do not depend on it.
type Clock interface {
	Now() time.Time
	// TimerAt returns a timer that fires once this clock reaches t; at once
	// when it has. The deadline is absolute, so a clock that steps (a test's)
	// between reading Now and arming the timer cannot push it out of reach.
	TimerAt(t time.Time) Timer
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// SystemClock is the host's clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time            { return time.Now() }
func (SystemClock) TimerAt(t time.Time) Timer { return sysTimer{time.NewTimer(time.Until(t))} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }
