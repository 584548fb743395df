package lockstep_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Allow admits a burst, then tells the wait until the next admission,
// after which it admits again.
func TestAllowAdmitsBurstThenWaits(t *testing.T) {
	t.Parallel()
	locker := lockstep.NewLocker(redistest.Start(t).Client(), lockstep.WithoutNotices())
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	ctx := context.Background()
	r := lockstep.RateLimit{N: 5, Per: time.Second, Burst: 2}
	for i := range 2 {
		if wait, err := locker.Allow(ctx, "partner", r); err != nil || wait != 0 {
			t.Fatalf("admission %d: wait %v, err %v", i+1, wait, err)
		}
	}
	wait, err := locker.Allow(ctx, "partner", r)
	if err != nil || wait <= 0 || wait > 200*time.Millisecond {
		t.Fatalf("past the burst: wait %v, err %v; want (0, 200ms]", wait, err)
	}
	time.Sleep(wait)
	if wait, err := locker.Allow(ctx, "partner", r); err != nil || wait != 0 {
		t.Fatalf("after the wait: wait %v, err %v; want admitted", wait, err)
	}
	if _, err := locker.Allow(ctx, "partner", lockstep.RateLimit{N: 0, Per: time.Second}); err == nil {
		t.Fatal("N: 0 accepted")
	}
}
