package asynqstore

import "testing"

// Only asynq's dequeue is recorded: calls of another shape pass through.
func TestDequeueKeys(t *testing.T) {
	p := queuePrefix("q:1")
	if q, ok := dequeueKeys([]string{p + "pending", p + "paused", p + "active", p + "lease"}); !ok || q != "q:1" {
		t.Errorf("dequeue keys: %q %v, want q:1", q, ok)
	}
	for _, keys := range [][]string{
		{p + "pending", p + "paused", p + "active"},
		{p + "pending", p + "paused", p + "active", p + "retry"},
		{"other:{q}:pending", "other:{q}:paused", "other:{q}:active", "other:{q}:lease"},
		{p + "pending", queuePrefix("r") + "paused", p + "active", p + "lease"},
	} {
		if _, ok := dequeueKeys(keys); ok {
			t.Errorf("%q taken for asynq's dequeue", keys)
		}
	}
	for id, want := range map[string]bool{"a-1:b_c/d": true, `x"y`: false, `x\y`: false, "x<y": false, "é": false, "x\ty": false} {
		if Recorded(id) != want {
			t.Errorf("Recorded(%q) = %v, want %v", id, !want, want)
		}
	}
}
