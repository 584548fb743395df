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

func connect(t testing.TB, db *sqltest.DB) *pgx.Conn {
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

// TestQueue: a check queued in a batch with the write it guards gives
// Check's verdicts once the batch is read: accepted (new, equal), stale
// with the current fence, another lock's, a token of 0; on a refusal the
// rolled-back transaction leaves the write out. A stale holder's batch
// waits behind its successor's row lock and is refused once it commits.
func TestQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := sqltest.Postgres(t)
	tbl := fence.Postgres("fences")
	c1, c2 := connect(t, db), connect(t, db)
	if err := pgxfence.Create(ctx, c1, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Exec(ctx, "CREATE TABLE orders (id bigserial PRIMARY KEY, fence bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	// write runs one fenced write of token in a transaction of c: the check
	// and the insert in one batch; committed when the verdict is nil.
	write := func(c *pgx.Conn, table *fence.Table, token int64) error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		b := &pgx.Batch{}
		verdict := pgxfence.Queue(b, table, "r", 0, token)
		b.Queue("INSERT INTO orders (fence) VALUES ($1)", token)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if err := verdict.Err(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for _, token := range []int64{5, 5} { // new, then equal
		if err := write(c1, tbl, token); err != nil {
			t.Fatalf("write %d: %v", token, err)
		}
	}
	var se *fence.StaleError
	if err := write(c1, tbl, 4); !errors.As(err, &se) || se.Current != 5 || se.Token != 4 {
		t.Fatalf("a lower token: %v, want stale with the current fence 5", err)
	}
	if err := write(c1, tbl.LockName("etcd"), 9); !errors.Is(err, fence.ErrOtherLock) {
		t.Fatalf("another lock: %v", err)
	}
	if err := write(c1, tbl, 0); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("fence 0: %v", err)
	}
	rows, _ := c1.Query(ctx, "SELECT fence FROM orders ORDER BY id")
	fences, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(fences) != 2 || fences[0] != 5 || fences[1] != 5 {
		t.Fatalf("orders written %v (%v), want the two accepted writes only", fences, err)
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
	result := make(chan error, 1)
	go func() { result <- write(c2, tbl, 5) }()
	db.WaitLockWait(t, pid, 10*time.Second)
	if err := succ.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-result; !errors.As(err, &se) || se.Current != 6 || se.Token != 5 {
		t.Fatalf("a stale holder's batch after its successor committed: %v", err)
	}
}
