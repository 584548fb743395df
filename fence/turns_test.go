package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

var levels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

const (
	staleFence     = 5 // the holder whose lock has passed on
	successorFence = 6 // the holder after it
	blockTimeout   = 10 * time.Second
)

// TestTurns: a stale holder and its successor, on two connections, take
// turns on the fence row at every isolation level, in both orders, with and
// without a fence recorded before. The second to check is seen blocked by
// the server itself (pg_stat_activity, innodb_trx) until the first commits;
// then the stale holder is refused, however it got its snapshot, and the
// successor accepted. A serialization failure is allowed only where the
// server raises it (PostgreSQL above READ COMMITTED; MariaDB only with
// innodb_snapshot_isolation on, its default from 11.6), is retryable, and
// the retry reaches the same verdict. Each holder writes an order in its
// transaction: only accepted holders' orders are committed.
func TestTurns(t *testing.T) { eachTurn(t, false) }

// TestTurnsExec is TestTurns with each holder's check in its write's own
// round trip (Exec). On PostgreSQL the second holder's statement has
// written its order when it waits for the fence row (the check runs after
// the statement's own write); a refusal undoes it.
func TestTurnsExec(t *testing.T) { eachTurn(t, true) }

// eachTurn runs turns on each server at each level, in both orders, with
// and without a fence recorded before; exec: the checks through Exec.
func eachTurn(t *testing.T, exec bool) {
	each(t, func(t *testing.T, s server) {
		for _, level := range levels {
			for _, staleFirst := range []bool{false, true} {
				for _, fresh := range []bool{false, true} {
					name := fmt.Sprintf("%v/stale_first=%v/fresh=%v", level, staleFirst, fresh)
					t.Run(name, func(t *testing.T) {
						turns(t, s, level, staleFirst, fresh, exec)
					})
				}
			}
		}
	})
}

// turns is TestTurns's case; exec writes each holder's order with Exec
// instead of Check and an INSERT.
func turns(t *testing.T, s server, level sql.IsolationLevel, staleFirst, fresh, exec bool) {
	db, tbl := setup(t, s)
	ctx := testContext(t)
	const res = "lock:order:1"
	if !fresh {
		// The stale holder began when its lock was still its own.
		if err := tbl.Check(ctx, db, res, 0, staleFence); err != nil {
			t.Fatal(err)
		}
	}
	first, second := holder{s, db, tbl, res, successorFence, level, exec}, holder{s, db, tbl, res, staleFence, level, exec}
	if staleFirst {
		first, second = second, first
	}
	pool := db.DB
	if exec {
		pool = execPool(t, db)
	}
	c1, c2 := conn(t, pool), conn(t, pool)
	waiter := db.Session(t, c2)
	tx1, tx2 := first.begin(t, c1), second.begin(t, c2)
	defer tx1.Rollback()
	defer tx2.Rollback()
	// Both take their snapshots before either checks: a snapshot read must
	// not decide the verdict later.
	first.snapshot(t, tx1)
	second.snapshot(t, tx2)

	if err := first.write(ctx, tx1); err != nil {
		t.Fatalf("first holder (fence %d): %v", first.token, err)
	}
	result := make(chan error, 1)
	go func() { result <- second.write(ctx, tx2) }()
	db.WaitLockWait(t, waiter, blockTimeout)
	select {
	case err := <-result:
		t.Fatalf("the second holder's check returned while the first held the row: %v", err)
	default:
	}
	if err := tx1.Commit(); err != nil {
		t.Fatalf("first holder's commit: %v", err)
	}
	var err error
	select {
	case err = <-result:
	case <-ctx.Done():
		t.Fatal("the second holder's check never returned after the first committed")
	}
	if err == nil {
		err = tx2.Commit()
	}
	if fence.IsRetryable(err) {
		if level == sql.LevelReadCommitted || (s.name == "mysql" && !snapshotIsolation(t, db)) {
			t.Fatalf("%s at %v: serialization failure %v where the server should have waited and judged", s.name, level, err)
		}
		if errors.Is(err, fence.ErrStale) {
			t.Fatalf("a stale error is retryable: %v", err)
		}
		t.Logf("second holder: %v; retrying", err)
		_ = tx2.Rollback()
		err = second.run(t, ctx, c2)
	}

	if staleFirst {
		// The stale holder wrote before its successor began: both stand.
		if err != nil {
			t.Fatalf("successor after the stale holder committed: %v", err)
		}
		wantOrders(t, db, res, staleFence, successorFence)
	} else {
		wantStale(t, err, res, 0, staleFence, successorFence)
		wantOrders(t, db, res, successorFence)
	}
	wantRecorded(t, db, res, 0, successorFence, "")
}

// snapshotIsolation reports whether MariaDB's innodb_snapshot_isolation is
// on (the default from 11.6): then a locking read of a row changed since the
// REPEATABLE READ snapshot fails with 1020 instead of reading the latest.
func snapshotIsolation(t *testing.T, db *sqltest.DB) bool {
	var on bool
	err := db.QueryRowContext(testContext(t), "SELECT @@innodb_snapshot_isolation").Scan(&on)
	return err == nil && on
}

// holder is one lock holder's transaction: check its fence, write an order.
type holder struct {
	s     server
	db    *sqltest.DB
	tbl   *fence.Table
	res   string
	token int64
	level sql.IsolationLevel
	exec  bool // the check in the write's statement (Exec)
}

func (h holder) begin(t *testing.T, c *sql.Conn) *sql.Tx {
	t.Helper()
	tx, err := c.BeginTx(testContext(t), &sql.TxOptions{Isolation: h.level})
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// snapshot reads the fence row with a plain read, which fixes the
// transaction's snapshot at REPEATABLE READ. MySQL's SERIALIZABLE makes every
// read a locking one (no snapshot), so it reads nothing there: a shared lock
// taken now would make the holders deadlock instead of taking turns.
func (h holder) snapshot(t *testing.T, tx *sql.Tx) {
	t.Helper()
	if h.s.name == "mysql" && h.level == sql.LevelSerializable {
		return
	}
	q := "SELECT count(*) FROM fences WHERE resource = $1"
	if h.s.name == "mysql" {
		q = "SELECT count(*) FROM fences WHERE resource = ?"
	}
	var n int
	if err := tx.QueryRowContext(testContext(t), q, h.res).Scan(&n); err != nil {
		t.Fatal(err)
	}
}

// write checks the fence and writes the order, in tx.
func (h holder) write(ctx context.Context, tx *sql.Tx) error {
	if h.exec {
		_, err := h.tbl.Exec(ctx, tx, h.res, 0, h.token, insertOrder(h.s), h.res, h.token)
		return err
	}
	if err := h.tbl.Check(ctx, tx, h.res, 0, h.token); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, insertOrder(h.s), h.res, h.token)
	return err
}

// run is the holder's whole transaction on c, once more (a retry).
func (h holder) run(t *testing.T, ctx context.Context, c *sql.Conn) error {
	tx := h.begin(t, c)
	defer tx.Rollback()
	if err := h.write(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

func conn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
