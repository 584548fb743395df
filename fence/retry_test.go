package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
)

// TestDeadlockRetryable: two transactions that check two resources in
// opposite orders deadlock; the server aborts one (PostgreSQL 40P01, InnoDB
// 1213), and IsRetryable says to run it again; the other goes on.
func TestDeadlockRetryable(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		c1, c2 := conn(t, db.DB), conn(t, db.DB)
		s1 := db.Session(t, c1)
		tx1, err := c1.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx1.Rollback()
		tx2, err := c2.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		if err := tbl.Check(ctx, tx1, "a", 0, 1); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Check(ctx, tx2, "b", 0, 1); err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() { first <- tbl.Check(ctx, tx1, "b", 0, 2) }()
		db.WaitLockWait(t, s1, blockTimeout)
		err2 := tbl.Check(ctx, tx2, "a", 0, 2)
		if err2 == nil { // tx1 was the victim: tx2 got its row
			if err := tx2.Commit(); err != nil {
				t.Fatal(err)
			}
		} else {
			_ = tx2.Rollback() // tx2 was: tx1 gets its row
		}
		var err1 error
		select {
		case err1 = <-first:
		case <-ctx.Done():
			t.Fatal("the first transaction's check never returned")
		}
		if (err1 == nil) == (err2 == nil) {
			t.Fatalf("want exactly one deadlock victim; errors: %v; %v", err1, err2)
		}
		victim := errors.Join(err1, err2)
		if !fence.IsRetryable(victim) || errors.Is(victim, fence.ErrStale) {
			t.Fatalf("deadlock %v: retryable %v, want true", victim, fence.IsRetryable(victim))
		}
		t.Logf("victim: %v", victim)
	})
}

// TestSerializationFailureRetryable: at REPEATABLE READ, a check of a fence
// row that another transaction changed after this one's snapshot fails
// (PostgreSQL 40001; MariaDB 1020 with innodb_snapshot_isolation), is
// retryable, and the retry is judged on the latest fence. MariaDB without
// innodb_snapshot_isolation (its default before 11.6) checks the latest row
// instead: TestTurns holds it to that.
func TestSerializationFailureRetryable(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		if err := tbl.Check(ctx, db, "r", 0, 5); err != nil {
			t.Fatal(err)
		}
		c := conn(t, db.DB)
		if s.name == "mysql" {
			if _, err := c.ExecContext(ctx, "SET SESSION innodb_snapshot_isolation = ON"); err != nil {
				t.Fatalf("this MariaDB has no innodb_snapshot_isolation (10.6.18, 10.11.8 and later do): %v", err)
			}
		}
		attempt := func(token int64, interfere bool) error {
			tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			holder{s: s, res: "r", level: sql.LevelRepeatableRead}.snapshot(t, tx)
			if interfere { // a newer holder commits after this snapshot
				if err := tbl.Check(ctx, db, "r", 0, token-1); err != nil {
					t.Fatal(err)
				}
			}
			if err := tbl.Check(ctx, tx, "r", 0, token); err != nil {
				return err
			}
			return tx.Commit()
		}
		err := attempt(7, true)
		if errors.Is(err, fence.ErrStale) {
			t.Fatalf("judged on the snapshot's fence: %v", err)
		}
		if !fence.IsRetryable(err) {
			t.Fatalf("check after a concurrent change: %v, want a retryable error", err)
		}
		t.Logf("first attempt: %v", err)
		wantRecorded(t, db, "r", 0, 6, "")
		if err := attempt(7, false); err != nil {
			t.Fatalf("retry: %v", err)
		}
		wantRecorded(t, db, "r", 0, 7, "")
	})
}

// pgError has the SQLState method of pgx's *pgconn.PgError and lib/pq's
// *pq.Error.
type pgError struct{ code string }

func (e *pgError) Error() string    { return "pg " + e.code }
func (e *pgError) SQLState() string { return e.code }

// MySQLError has the name and Number field of go-sql-driver/mysql's.
type MySQLError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

func TestIsRetryable(t *testing.T) {
	stale := &fence.StaleError{Resource: "r", Token: 1, Current: 2}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("40001"), false},
		{&pgError{"40001"}, true},
		{&pgError{"40P01"}, true},
		{&pgError{"23505"}, false},
		{fmt.Errorf("fence: check: %w", &pgError{"40001"}), true},
		{errors.Join(errors.New("x"), fmt.Errorf("y: %w", &pgError{"40P01"})), true},
		{&MySQLError{Number: 1213}, true},
		{&MySQLError{Number: 1205}, true},
		{&MySQLError{Number: 1020}, true},
		{&MySQLError{Number: 1062}, false},
		{fmt.Errorf("w: %w", &MySQLError{Number: 1213}), true},
		{(*MySQLError)(nil), false},
		{stale, false},
		{fmt.Errorf("w: %w", stale), false},
		{errors.Join(stale, &pgError{"40001"}), false}, // a refusal is never retried
		{&fence.OtherLockError{Resource: "r"}, false},
		{fence.ErrNoFence, false},
		{context.DeadlineExceeded, false},
		{sql.ErrTxDone, false},
	} {
		if got := fence.IsRetryable(c.err); got != c.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
