package proctest

import (
	"sync/atomic"
	"testing"
	"time"
)

// Lateness measures how late this process's timers fire while a test runs:
// a goroutine waits on a timer of probeEvery, again and again, and keeps the
// largest overshoot. A bound that the watchdog can only meet as fast as the
// machine schedules it (a deadline timer's, a renewal round's) widens by
// what the probe measured over the same stretch, not by a guess: on an idle
// machine that is a millisecond or two, under a CPU hog what the hog took.
type Lateness struct {
	max  atomic.Int64 // nanoseconds
	stop chan struct{}
	done chan struct{}
}

// probeEvery is how often the probe looks.
const probeEvery = 5 * time.Millisecond

// MeasureLateness starts a probe, stopped when the test ends.
func MeasureLateness(t testing.TB) *Lateness {
	l := &Lateness{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		timer := time.NewTimer(probeEvery)
		defer timer.Stop()
		for due := time.Now().Add(probeEvery); ; due = time.Now().Add(probeEvery) {
			select {
			case <-l.stop:
				return
			case now := <-timer.C:
				if late := int64(now.Sub(due)); late > l.max.Load() {
					l.max.Store(late)
				}
				timer.Reset(probeEvery)
			}
		}
	}()
	t.Cleanup(func() { close(l.stop); <-l.done })
	return l
}

// Max is the largest overshoot seen so far.
func (l *Lateness) Max() time.Duration { return time.Duration(l.max.Load()) }
