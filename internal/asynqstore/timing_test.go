package asynqstore

import (
	"context"
	"testing"
	"time"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_000, 0)
	for _, c := range []struct {
		now time.Duration // after base
		d   time.Duration
	}{
		{0, 0}, {0, 300 * time.Millisecond}, {900 * time.Millisecond, 300 * time.Millisecond},
		{999 * time.Millisecond, time.Millisecond}, {400 * time.Millisecond, 2600 * time.Millisecond},
	} {
		now := base.Add(c.now)
		got := RetryDelay(c.d, now)
		ready := now.Add(got)
		// asynq's score is the Unix second of the ready time, forwarded once
		// that second has begun: it must not begin before now+d.
		if start := time.Unix(ready.Unix(), 0); start.Before(now.Add(c.d)) {
			t.Errorf("now %v, d %v: delay %v is forwarded at %v, before now+d", c.now, c.d, got, start.Sub(base))
		}
		if got > c.d+time.Second+10*time.Millisecond {
			t.Errorf("now %v, d %v: delay %v, want under d + 1s", c.now, c.d, got)
		}
	}
}

// A run is bounded by the earlier of the task's timeout (from now) and its
// deadline, and by nothing when it has neither.
func TestTaskMsgContext(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		name string
		m    TaskMsg
		want time.Time // zero: no deadline
	}{
		{"neither", TaskMsg{}, time.Time{}},
		{"timeout", TaskMsg{Timeout: 30}, now.Add(30 * time.Second)},
		{"deadline", TaskMsg{Deadline: now.Unix() + 100}, time.Unix(now.Unix()+100, 0)},
		{"timeout first", TaskMsg{Timeout: 30, Deadline: now.Unix() + 100}, now.Add(30 * time.Second)},
		{"deadline first", TaskMsg{Timeout: 300, Deadline: now.Unix() + 100}, time.Unix(now.Unix()+100, 0)},
	} {
		ctx, cancel := c.m.Context(context.Background())
		d, ok := ctx.Deadline()
		cancel()
		switch {
		case c.want.IsZero() && ok:
			t.Errorf("%s: deadline %v, want none", c.name, d)
		case !c.want.IsZero() && (!ok || d.Sub(c.want).Abs() > 2*time.Second):
			t.Errorf("%s: deadline %v (%v), want %v", c.name, d, ok, c.want)
		}
	}
}
