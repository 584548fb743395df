package asynqstore

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// An asynq server on RecordDequeues' client runs its tasks as asynq would
// (its Inspector sees them active, then completed), and each task is in
// the holds set from the moment asynq hands it over: before its handler
// runs. An id that JSON would escape is run, not recorded.
func TestRecordDequeuesRecordsAsAsynqHandsOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	const holds = "test:holds"
	record := func(queue, id string) string { return "rec:" + queue + ":" + id + ":end" }
	running := make(chan string, 2)
	release := make(chan struct{})
	w := asynq.NewServerFromRedisClient(RecordDequeues(c, holds, record), asynq.Config{Concurrency: 2, LogLevel: asynq.FatalLevel})
	if err := w.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		running <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Shutdown)
	enq := asynq.NewClientFromRedisClient(c)
	t.Cleanup(func() { _ = enq.Close() })
	for _, id := range []string{"plain-1", `quoted"id`} {
		if _, err := enq.Enqueue(asynq.NewTask("t:rec", nil), asynq.TaskID(id)); err != nil {
			t.Fatal(err)
		}
	}
	insp := asynq.NewInspectorFromRedisClient(c)
	for range 2 {
		select {
		case <-running:
		case <-time.After(10 * time.Second):
			t.Fatal("asynq did not run the tasks")
		}
	}
	got, err := c.SMembers(t.Context(), holds).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != record("default", "plain-1") {
		t.Errorf("holds set %q, want only %q", got, record("default", "plain-1"))
	}
	for _, id := range []string{"plain-1", `quoted"id`} {
		if info, err := insp.GetTaskInfo("default", id); err != nil || info.State != asynq.TaskStateActive {
			t.Errorf("%s: %v %v, want active", id, info, err)
		}
	}
	close(release)
	redistest.WaitFor(t, 10*time.Second, "both tasks processed", func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Processed == 2 && q.Active == 0
	})
}

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
