package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// A release moves the longest waiting task to the head of its queue at once:
// with a 3s minimum backoff, the waiter still runs well within a second of
// the release.
func TestContentionWakesNextWaiter(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.Backoff.Min, cfg.Backoff.Max = 3*time.Second, 10*time.Second
	cfg.PollInterval = 20 * time.Millisecond
	started := make(chan struct{})
	finish := make(chan struct{})
	e := newEnv(t, cfg, lockedSpec("t:locked", "res", func(_ context.Context, job Job) error {
		if job.ID == "holder" {
			close(started)
			<-finish
		}
		return nil
	}))
	e.enqueue("t:locked", "holder", nil)
	<-started
	e.enqueue("t:locked", "waiter", nil)
	e.waitState("waiter", asynq.TaskStateRetry, 10*time.Second)
	released := time.Now()
	close(finish)
	info := e.waitState("waiter", asynq.TaskStateCompleted, 10*time.Second)
	if d := info.CompletedAt.Sub(released); d > time.Second {
		t.Fatalf("waiter completed %v after the release, want it woken at once (its backoff is 3s or more)", d)
	}
	if n := e.admin.ZCard(context.Background(), "lockstep:{res}:queue").Val(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}
