package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/backoff"
)

func TestJitterGrowsWithinBounds(t *testing.T) {
	t.Parallel()
	b := backoff.Jitter{Min: 10 * time.Millisecond, Max: time.Second}
	var prev time.Duration
	distinct := map[time.Duration]bool{}
	var reachedHalfMax bool
	for range 200 {
		d := b.Next(prev)
		if d < b.Min || d > b.Max {
			t.Fatalf("delay %v outside [%v, %v]", d, b.Min, b.Max)
		}
		if d > b.Max/2 {
			reachedHalfMax = true
		}
		distinct[d] = true
		prev = d
	}
	if !reachedHalfMax {
		t.Fatal("200 decorrelated-jitter steps never grew past half the max")
	}
	if len(distinct) < 50 {
		t.Fatalf("only %d distinct delays in 200: no jitter", len(distinct))
	}
	if d := b.Nth(1); d > 30*time.Millisecond {
		t.Fatalf("Nth(1) = %v, want at most 3×Min", d)
	}
	for range 100 {
		if d := b.Nth(50); d < b.Min || d > b.Max {
			t.Fatalf("Nth(50) = %v outside bounds", d)
		}
	}
}

func TestJitterDegenerateBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		b    backoff.Jitter
		want time.Duration
	}{
		{backoff.Jitter{}, time.Millisecond},                                        // no bounds: 1ms
		{backoff.Jitter{Min: 50 * time.Millisecond, Max: 0}, 50 * time.Millisecond}, // max below min: min
		{backoff.Jitter{Min: time.Second, Max: time.Second}, time.Second},
	} {
		for _, prev := range []time.Duration{0, time.Millisecond, time.Hour} {
			if d := tc.b.Next(prev); d != tc.want {
				t.Errorf("%+v.Next(%v) = %v, want %v", tc.b, prev, d, tc.want)
			}
		}
	}
}

func TestDefaultsAreOrdered(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]backoff.Jitter{
		"LockWait": backoff.LockWait, "Requeue": backoff.Requeue, "RedisRetry": backoff.RedisRetry,
		"Reconnect": backoff.Reconnect,
	} {
		if b.Min <= 0 || b.Max < b.Min {
			t.Errorf("%s = %+v: want 0 < Min ≤ Max", name, b)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	start := time.Now()
	if !backoff.Sleep(context.Background(), 5*time.Millisecond) {
		t.Fatal("Sleep(background, 5ms) = false, want true")
	}
	if el := time.Since(start); el < 5*time.Millisecond {
		t.Fatalf("Sleep(5ms) returned after %v", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if backoff.Sleep(ctx, time.Hour) {
		t.Fatal("Sleep(cancelled, 1h) = true, want false")
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Sleep with a cancelled context took %v", el)
	}
}
