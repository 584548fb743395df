package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// TestLostLockRefused, with a real lock and a real PostgreSQL: a holder
// records its fence at begin, then stalls; its lock passes on (the key is
// deleted, as when a paused holder's TTL runs out) and the next holder,
// with a higher fence, writes its order. When the first resumes and writes
// anyway (ignoring its cancelled context, as a process resumed mid-write
// would), Check refuses it in its own transaction: its order never lands,
// the next holder's stands.
func TestLostLockRefused(t *testing.T) {
	ctx := testContext(t)
	rdb := redistest.Start(t).Client()
	locker := lockstep.NewLocker(rdb)
	defer locker.Close(context.Background())
	s := servers[0] // postgres
	db, tbl := setup(t, s)
	const key = "lock:order:e2e"

	write := func(ctx context.Context, lease *lockstep.Lease) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := tbl.CheckLease(ctx, tx, lease); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insertOrder(s), key, lease.Fence()); err != nil {
			return err
		}
		return tx.Commit()
	}

	begun, resume, firstDone := make(chan int64, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		firstDone <- locker.WithLock(ctx, key, func(ctx context.Context, lease *lockstep.Lease) error {
			if err := tbl.CheckLease(ctx, db, lease); err != nil { // begin
				return err
			}
			begun <- lease.Fence()
			<-resume // stalled
			return write(context.WithoutCancel(ctx), lease)
		}, lockstep.TTL(10*time.Second))
	}()
	first := redistest.Receive(t, begun, 10*time.Second, "the first holder's begin")

	if err := rdb.Del(ctx, "lockstep:{"+key+"}").Err(); err != nil { // the lock passes on
		t.Fatal(err)
	}
	var second int64
	err := locker.WithLock(ctx, key, func(ctx context.Context, lease *lockstep.Lease) error {
		second = lease.Fence()
		if err := tbl.CheckLease(ctx, db, lease); err != nil { // begin
			return err
		}
		return write(ctx, lease)
	}, lockstep.Wait(10*time.Second))
	if err != nil {
		t.Fatalf("the next holder: %v", err)
	}
	if second <= first {
		t.Fatalf("the next holder's fence %d is not above %d", second, first)
	}

	t.Logf("fences: first %d, second %d", first, second)
	close(resume)
	err = redistest.Receive(t, firstDone, 10*time.Second, "the first holder's end")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Token != first || se.Current != second {
		t.Fatalf("the resumed holder's write: %v, want a StaleError of %d under %d", err, first, second)
	}
	if !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("WithLock does not report the loss: %v", err)
	}
	wantOrders(t, db, key, second)
	wantRecorded(t, db, key, 0, second, "")
}
