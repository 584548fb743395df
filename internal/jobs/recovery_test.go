package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// A hold record of a task that left this process's hands stays while asynq
// still has the task active: its handler returned, but asynq had not
// recorded the result (it retries that while Redis is away), and a worker
// killed then must leave a record for a recoverer, not the task to asynq's
// own lease. Once asynq has the result, the record goes within two beats.
func TestRecordStaysWhileAsynqHasTheTaskActive(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	e := newEnv(t, testConfig(), lockedSpec("t:slow", "slow", func(ctx context.Context, job Job) error {
		<-release
		return nil
	}))
	ctx := context.Background()
	e.enqueueID("t:slow", "kept")
	holds := e.srv.recovery.reg.Holds()
	rec := lock.HoldRecord("slow", "default", "kept")
	waitFor(t, 10*time.Second, "the running task's hold record", func() bool {
		return e.admin.SIsMember(ctx, holds, rec).Val()
	})
	// As if the handler had returned: the record is queued for removal,
	// while asynq still has the task active.
	e.srv.recovery.left("slow", "default", "kept")
	beats := func(n int) {
		t.Helper()
		seen, last := 0, e.admin.ZScore(ctx, e.locker.ProcessesKey(), e.srv.recovery.reg.Process()).Val()
		waitFor(t, 10*time.Second, "beats", func() bool {
			if s := e.admin.ZScore(ctx, e.locker.ProcessesKey(), e.srv.recovery.reg.Process()).Val(); s != last {
				seen, last = seen+1, s
			}
			return seen >= n
		})
	}
	beats(4)
	if !e.admin.SIsMember(ctx, holds, rec).Val() {
		t.Fatal("the record was removed while asynq still had the task active")
	}
	close(release)
	waitFor(t, 10*time.Second, "the task done in asynq", func() bool {
		_, err := e.insp.GetTaskInfo("default", "kept")
		return errors.Is(err, asynq.ErrTaskNotFound) // done, without retention
	})
	beats(3)
	if e.admin.SIsMember(ctx, holds, rec).Val() {
		t.Fatal("the record stayed after asynq recorded the task's result")
	}
}

// A record whose task asynq delivered again since it left this process (its
// lease set further ahead than this delivery's could be: another server's
// delivery or heartbeat) goes at the next beats although the task is
// active: it is another process's task now, and a record of it here would
// keep a recoverer from bringing it back from that process, should it die.
func TestRecordGoesWhenAsynqDeliveredTheTaskAgain(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	e := newEnv(t, testConfig(), lockedSpec("t:slow", "slow", func(ctx context.Context, job Job) error {
		<-release
		return nil
	}))
	ctx := context.Background()
	e.enqueueID("t:slow", "again")
	holds := e.srv.recovery.reg.Holds()
	rec := lock.HoldRecord("slow", "default", "again")
	waitFor(t, 10*time.Second, "the running task's hold record", func() bool {
		return e.admin.SIsMember(ctx, holds, rec).Val()
	})
	e.srv.recovery.left("slow", "default", "again")
	// Another server's delivery of it: a lease a minute ahead.
	if err := e.admin.ZAddXX(ctx, "asynq:{default}:lease", redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: "again"}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the record gone while asynq has the task active", func() bool {
		return !e.admin.SIsMember(ctx, holds, rec).Val()
	})
	if info, err := e.insp.GetTaskInfo("default", "again"); err != nil || info.State != asynq.TaskStateActive {
		t.Fatalf("the task is %v (%v), want still active", info, err)
	}
}
