package scheduler

import (
	"sync"
	"time"
)

// fakeClock stands still until a test sets it. Timers whose deadline it
// reaches fire on Set; a timer created with a deadline already reached fires
// at once, so a wake-up is never lost.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
}

func newFakeClock(t time.Time) *fakeClock {
	return &fakeClock{now: t, timers: make(map[*fakeTimer]struct{})}
}

type fakeTimer struct {
	c     chan time.Time
	at    time.Time
	clock *fakeClock
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) TimerAt(at time.Time) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: at, clock: c}
	if !at.After(c.now) {
		t.c <- c.now
	} else {
		c.timers[t] = struct{}{}
	}
	return t
}

// Set moves the clock to t (forward or back) and fires the timers it reached.
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	for tm := range c.timers {
		if !tm.at.After(t) {
			tm.c <- t
			delete(c.timers, tm)
		}
	}
}

func (c *fakeClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	_, ok := t.clock.timers[t]
	delete(t.clock.timers, t)
	return ok
}

// skewedClock is the host's clock off by a fixed offset: a replica whose
// clock is wrong. Durations run at the real rate.
type skewedClock struct{ off time.Duration }

func (c skewedClock) Now() time.Time            { return time.Now().Add(c.off) }
func (c skewedClock) TimerAt(t time.Time) Timer { return SystemClock{}.TimerAt(t.Add(-c.off)) }
