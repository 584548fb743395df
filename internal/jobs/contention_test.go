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
	if n := e.admin.ZCard(context.Background(), "lockstep:{res}:waiters").Val(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// A wake-up moves only a task in the retry state: a pending, archived or
// missing task is left as it is, so a wake never runs a task twice.
func TestWakeTouchesOnlyRetryTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{Queues: map[string]int{"other": 1}}) // serves no queue the tasks are in
	e.enqueue("t:x", "pending", nil)
	e.enqueue("t:x", "archived", nil)
	if err := e.insp.ArchiveTask("default", "archived"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"pending", "archived", "missing"} {
		got, err := run(ctx, e.client, scriptWake, asynqTaskKeys("default", id), id, time.Now().UnixNano())
		if err != nil || got != int64(0) {
			t.Errorf("wake %s: %v, %v; want 0", id, got, err)
		}
	}
	if s := e.info("pending").State; s != asynq.TaskStatePending {
		t.Errorf("pending task now %v", s)
	}
	if s := e.info("archived").State; s != asynq.TaskStateArchived {
		t.Errorf("archived task now %v", s)
	}
	if n := e.admin.LLen(ctx, "asynq:{default}:pending").Val(); n != 1 {
		t.Errorf("pending list has %d tasks, want 1", n)
	}
}
