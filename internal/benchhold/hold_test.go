package benchhold

import (
	"testing"
	"time"
)

func TestHoldLastsItsTime(t *testing.T) {
	for range 5 {
		start := time.Now()
		Hold(2 * time.Millisecond)
		if got := time.Since(start); got < 2*time.Millisecond {
			t.Fatalf("Hold(2ms) returned after %v", got)
		}
	}
}
