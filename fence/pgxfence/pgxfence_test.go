package pgxfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/fence/pgxfence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(sqltest.Main(m)) }

func connect(t *testing.T, db *sqltest.DB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// TestCheck: pgx transactions get fence's verdicts, and a stale holder
// blocked behind its successor's row lock is refused once it commits.
func TestCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := sqltest.Postgres(t)
	tbl := fence.Postgres("fences")
	c1, c2 := connect(t, db), connect(t, db)
	if err := pgxfence.Create(ctx, c1, tbl); err != nil {
		t.Fatal(err)
	}
	for _, token := range []int64{5, 5} { // new, then equal
		if err := pgxfence.Check(ctx, c1, tbl, "r", 0, token); err != nil {
			t.Fatalf("check %d: %v", token, err)
		}
	}
	if err := pgxfence.Check(ctx, c1, tbl, "r", 0, 0); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("fence 0: %v", err)
	}
	if err := pgxfence.Check(ctx, c1, tbl.LockName("etcd"), "r", 0, 9); !errors.Is(err, fence.ErrOtherLock) {
		t.Fatalf("another lock: %v", err)
	}

	succ, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer succ.Rollback(ctx)
	if err := pgxfence.Check(ctx, succ, tbl, "r", 0, 6); err != nil {
		t.Fatal(err)
	}
	var pid int64
	if err := c2.QueryRow(ctx, "SELECT pg_backend_pid()::bigint").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	stale, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Rollback(ctx)
	result := make(chan error, 1)
	go func() { result <- pgxfence.Check(ctx, stale, tbl, "r", 0, 5) }()
	db.WaitLockWait(t, pid, 10*time.Second)
	if err := succ.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-result
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Current != 6 || se.Token != 5 {
		t.Fatalf("stale holder after its successor committed: %v", err)
	}

	if err := pgxfence.Check(ctx, c1, fence.MySQL("fences"), "r", 0, 7); err == nil {
		t.Fatal("a MySQL table was accepted")
	}
}

// TestRetryable: pgx's serialization failure is retryable for fence.
func TestRetryable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := sqltest.Postgres(t)
	tbl := fence.Postgres("fences")
	c1, c2 := connect(t, db), connect(t, db)
	if err := pgxfence.Create(ctx, c1, tbl); err != nil {
		t.Fatal(err)
	}
	if err := pgxfence.Check(ctx, c1, tbl, "r", 0, 5); err != nil {
		t.Fatal(err)
	}
	tx, err := c1.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM fences").Scan(&n); err != nil { // the snapshot
		t.Fatal(err)
	}
	if err := pgxfence.Check(ctx, c2, tbl, "r", 0, 6); err != nil {
		t.Fatal(err)
	}
	err = pgxfence.Check(ctx, tx, tbl, "r", 0, 7)
	if !fence.IsRetryable(err) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("check of a row changed since the snapshot: %v, want retryable", err)
	}
}
