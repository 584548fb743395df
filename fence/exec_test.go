package fence_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

const insertOrderPG = "INSERT INTO orders (resource, fence) VALUES ($1, $2)"

// execPool is the pool Exec runs on for db: db's own on PostgreSQL; on
// MySQL another on the same database whose DSN lets a query hold several
// statements, its arguments interpolated by the driver, as Exec needs.
func execPool(t testing.TB, db *sqltest.DB) *sql.DB {
	t.Helper()
	if db.Driver() != "mysql" {
		return db.DB
	}
	pool, err := sql.Open(db.Driver(), db.DSN+"?multiStatements=true&interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Close() })
	return pool
}

// execOrder writes an order of resource with token through tbl.Exec in a
// transaction of its own on pool, committed when Exec returns no error.
func execOrder(t *testing.T, pool *sql.DB, tbl *fence.Table, s server, resource string, token int64) (sql.Result, error) {
	t.Helper()
	ctx := testContext(t)
	tx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	r, err := tbl.Exec(ctx, tx, resource, 0, token, insertOrder(s), resource, token)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return r, nil
}

// TestExecStatements: UPDATE, DELETE and INSERT … SELECT are guarded too:
// written and counted when accepted, the fence recorded even when they
// touch no row; nothing written when refused.
func TestExecStatements(t *testing.T) {
	db, tbl := setup(t, servers[0])
	ctx := testContext(t)
	for _, f := range []int64{1, 1, 1} {
		if _, err := db.ExecContext(ctx, insertOrderPG, "r", f); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		query  string
		args   []any
		token  int64
		rows   int64 // affected when accepted
		orders []int64
	}{
		{"UPDATE orders SET fence = $1 WHERE resource = $2", []any{3, "r"}, 3, 3, []int64{3, 3, 3}},
		{"UPDATE orders SET fence = $1 WHERE resource = $2", []any{2, "r"}, 2, 0, []int64{3, 3, 3}}, // refused
		{"DELETE FROM orders WHERE id = (SELECT min(id) FROM orders)", nil, 2, 0, []int64{3, 3, 3}}, // refused
		{"DELETE FROM orders WHERE id = (SELECT min(id) FROM orders)", nil, 4, 1, []int64{3, 3}},
		{"DELETE FROM orders WHERE resource = 'none'", nil, 5, 0, []int64{3, 3}}, // no row, fence recorded
		{"INSERT INTO orders (resource, fence) SELECT resource, $1 FROM orders WHERE fence = $2", []any{6, 3}, 6, 2, []int64{3, 3, 6, 6}},
		{"INSERT INTO orders (resource, fence) SELECT resource, $1 FROM orders WHERE fence = $2", []any{4, 3}, 4, 0, []int64{3, 3, 6, 6}}, // refused
		// Comments, literals and quoted names that look like code are not.
		{"-- a comment; INSERT\n/* nested /* comment */ ; */ UPDATE orders SET resource = 'r;' || $1 WHERE fence = 6;  -- end",
			[]any{"x"}, 7, 2, []int64{3, 3}},
		{`UPDATE orders SET resource = E'r\'; $9' || $$;$2$$ || $a$ $1 ;$a$ || "resource" WHERE resource = 'r'`, nil, 7, 2, nil},
	} {
		before, _ := recorded(t, db, "r", 0)
		r, err := tbl.Exec(ctx, db, "r", 0, c.token, c.query, c.args...)
		if c.token < before {
			wantStale(t, err, "r", 0, c.token, before)
			wantRecorded(t, db, "r", 0, before, "")
		} else if err != nil {
			t.Fatalf("%s with fence %d: %v", c.query, c.token, err)
		} else {
			if n, _ := r.RowsAffected(); n != c.rows {
				t.Fatalf("%s: %d rows affected, want %d", c.query, n, c.rows)
			}
			wantRecorded(t, db, "r", 0, c.token, "")
		}
		wantOrders(t, db, "r", c.orders...)
	}
}

// TestExecRefusesUnguardable: a statement the check's WITH cannot guard is
// refused before anything runs, with an error that says why.
func TestExecRefusesUnguardable(t *testing.T) {
	db, tbl := setup(t, servers[0])
	ctx := testContext(t)
	for _, c := range []struct {
		query string
		args  []any
		says  string
	}{
		{"WITH x AS (SELECT 1) " + insertOrderPG, []any{"r", 1}, "WITH"},
		{" /* c */ with x AS (SELECT 1) " + insertOrderPG, []any{"r", 1}, "WITH"},
		{"SELECT * FROM orders", nil, `"SELECT"`},
		{"(SELECT 1)", nil, `"("`},
		{"MERGE INTO orders USING orders o ON false WHEN NOT MATCHED THEN DO NOTHING", nil, `"MERGE"`},
		{insertOrderPG + "; DELETE FROM orders", []any{"r", 1}, "one statement"},
		{insertOrderPG + ";\n--\n;INSERT INTO orders VALUES (1, 'r', 1)", []any{"r", 1}, "one statement"},
		{insertOrderPG, []any{"r"}, "$2"},
		{"  -- nothing\n", nil, "no statement"},
	} {
		_, err := tbl.Exec(ctx, db, "r", 0, 1, c.query, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.says) || errors.Is(err, fence.ErrStale) || fence.IsRetryable(err) {
			t.Fatalf("%q: got %v, want an error that says %s", c.query, err, c.says)
		}
	}
	wantRecorded(t, db, "r", 0, 0, "")
	wantOrders(t, db, "r")
}

// TestExec: a write with its check in the same round trip is written with
// its fence when Check would accept it (a new resource, the same fence
// again, a higher one) and its RowsAffected is its own; a lower fence is
// refused with the current fence and nothing of it is written. A refusal
// in a transaction: PostgreSQL aborts it (its commit fails); MySQL keeps it,
// the refused write undone, the one before it still there.
func TestExec(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		pool := execPool(t, db)
		ctx := testContext(t)
		const res = "lock:order:42"
		var written []int64
		for _, step := range []struct {
			token, after int64
			stale        bool
		}{
			{5, 5, false}, // new resource
			{5, 5, false}, // equal: the same holder writes again
			{7, 7, false}, // a newer holder
			{6, 7, true},  // an older holder
			{5, 7, true},
			{8, 8, false},
		} {
			r, err := execOrder(t, pool, tbl, s, res, step.token)
			if step.stale {
				wantStale(t, err, res, 0, step.token, step.after)
			} else if err != nil {
				t.Fatalf("exec with %d: %v", step.token, err)
			} else if n, err := r.RowsAffected(); n != 1 || err != nil {
				t.Fatalf("exec with %d: %d rows affected (%v), want the INSERT's 1", step.token, n, err)
			} else {
				written = append(written, step.token)
			}
			wantRecorded(t, db, res, 0, step.after, "")
			wantOrders(t, db, res, written...)
		}

		tx, err := pool.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, insertOrder(s), res, 100); err != nil {
			t.Fatal(err)
		}
		_, err = tbl.Exec(ctx, tx, res, 0, 6, insertOrder(s), res, 6)
		wantStale(t, err, res, 0, 6, 8)
		err = tx.Commit()
		if s.name == "postgres" {
			if err == nil {
				t.Fatal("a transaction whose fenced statement was refused committed")
			}
		} else if err != nil {
			t.Fatal(err)
		} else {
			written = append(written, 100)
		}
		wantOrders(t, db, res, written...)
		wantRecorded(t, db, res, 0, 8, "")
	})
}

// TestExecOtherLock: a resource fenced by one lock refuses another lock's
// write, however high its fence, with both lock names (any bytes) in the
// error; nothing is written.
func TestExecOtherLock(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		pool := execPool(t, db)
		const odd = `ré"dis .' 0`
		mine, other := tbl.LockName(odd), tbl.LockName("etcd")
		if _, err := execOrder(t, pool, mine, s, "r", 5); err != nil {
			t.Fatal(err)
		}
		for _, token := range []int64{4, 5, 1 << 40} {
			_, err := execOrder(t, pool, other, s, "r", token)
			var oe *fence.OtherLockError
			if !errors.As(err, &oe) || *oe != (fence.OtherLockError{Resource: "r", Permit: 0, Lock: "etcd", Recorded: odd}) {
				t.Fatalf("fence %d: got %v, want an OtherLockError", token, err)
			}
			if !errors.Is(err, fence.ErrOtherLock) || errors.Is(err, fence.ErrStale) || fence.IsRetryable(err) {
				t.Fatalf("%v: want ErrOtherLock only, not retryable", err)
			}
		}
		wantRecorded(t, db, "r", 0, 5, odd)
		wantOrders(t, db, "r", 5)
		if _, err := execOrder(t, pool, mine, s, "r", 6); err != nil {
			t.Fatalf("the resource's own lock, after another's refusal: %v", err)
		}
		wantOrders(t, db, "r", 5, 6)
	})
}

// TestExecNoFence: a caller without a lock is refused before anything runs.
func TestExecNoFence(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		pool := execPool(t, db)
		for _, token := range []int64{0, -1} {
			_, err := execOrder(t, pool, tbl, s, "r", token)
			if !errors.Is(err, fence.ErrNoFence) || errors.Is(err, fence.ErrStale) || fence.IsRetryable(err) {
				t.Fatalf("exec with %d: %v, want ErrNoFence, not stale, not retryable", token, err)
			}
		}
		wantRecorded(t, db, "r", 0, 0, "")
		wantOrders(t, db, "r")
	})
}

// TestExecRollback: a fenced write is part of its transaction: rolled back,
// it leaves the fence where it was, and its write is gone.
func TestExecRollback(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		pool := execPool(t, db)
		ctx := testContext(t)
		if err := tbl.Check(ctx, db, "r", 0, 5); err != nil {
			t.Fatal(err)
		}
		tx, err := pool.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tbl.ExecLease(ctx, tx, lease{"r", 0, 10}, insertOrder(s), "r", 10); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, db, "r", 0, 5, "")
		wantOrders(t, db, "r")
		if _, err := execOrder(t, pool, tbl, s, "r", 8); err != nil {
			t.Fatalf("fence 8 after 10 was rolled back: %v", err)
		}
		wantOrders(t, db, "r", 8)
	})
}

// TestExecPostgresAlone: on PostgreSQL the fenced statement on the *sql.DB
// is a transaction of its own: accepted, written; refused, not.
func TestExecPostgresAlone(t *testing.T) {
	db, tbl := setup(t, servers[0])
	ctx := testContext(t)
	if _, err := tbl.ExecLease(ctx, db, lease{"r", 0, 8}, insertOrderPG, "r", 8); err != nil {
		t.Fatal(err)
	}
	_, err := tbl.ExecLease(ctx, db, lease{"r", 0, 7}, insertOrderPG, "r", 7)
	wantStale(t, err, "r", 0, 7, 8)
	wantOrders(t, db, "r", 8)
	wantRecorded(t, db, "r", 0, 8, "")
}

// TestExecMySQL: on MySQL, Exec takes a transaction only (outside one, the
// check would commit apart from the write) and says what a pool without
// multi-statement queries lacks; the statement's own error is returned as
// it is, not as a refusal, even the one a refusal uses (1690, an overflow).
func TestExecMySQL(t *testing.T) {
	s := servers[1]
	db, tbl := setup(t, s)
	pool := execPool(t, db)
	ctx := testContext(t)
	for _, q := range []fence.Querier{db, pool} {
		_, err := tbl.Exec(ctx, q, "r", 0, 1, insertOrder(s), "r", 1)
		if err == nil || !strings.Contains(err.Error(), "*sql.Tx") {
			t.Fatalf("Exec on %T: %v, want an error that asks for a *sql.Tx", q, err)
		}
	}
	tx, err := db.BeginTx(ctx, nil) // a pool without multiStatements
	if err != nil {
		t.Fatal(err)
	}
	_, err = tbl.Exec(ctx, tx, "r", 0, 1, insertOrder(s), "r", 1)
	_ = tx.Rollback()
	if err == nil || !strings.Contains(err.Error(), "multiStatements=true") {
		t.Fatalf("Exec on a pool without multi-statement queries: %v, want an error that names multiStatements", err)
	}
	wantRecorded(t, db, "r", 0, 0, "")

	tx, err = pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tbl.Exec(ctx, tx, "r", 0, 3, "INSERT INTO orders (resource, fence) VALUES (?, ~0 + 1)", "r")
	if err == nil || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "1690") {
		t.Fatalf("the statement's own error 1690: %v, want it as it is", err)
	}
	r, err := tbl.Exec(ctx, tx, "r", 0, 3, "UPDATE orders SET fence = ? WHERE resource = ?", 3, "none")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := r.RowsAffected(); n != 0 {
		t.Fatalf("an UPDATE of no row: %d rows affected, want the UPDATE's 0, not the check's", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	wantRecorded(t, db, "r", 0, 3, "")

	// The refusal stops the query in any sql_mode: not only where a bad
	// value is an error, but also where MySQL would store it with a warning.
	for _, mode := range []string{"", "STRICT_TRANS_TABLES", "TRADITIONAL", "ANSI"} {
		tx, err := pool.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "SET SESSION sql_mode = ?", mode); err != nil {
			t.Fatal(err)
		}
		_, err = tbl.Exec(ctx, tx, "r", 0, 2, insertOrder(s), "r", 2)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		t.Logf("sql_mode %q: %v", mode, err)
		wantStale(t, err, "r", 0, 2, 3)
		wantRecorded(t, db, "r", 0, 3, "")
		wantOrders(t, db, "r")
	}
}

// TestQueryRow: on PostgreSQL a fenced write with RETURNING gives its row
// (the id its INSERT made) when accepted; refused by the server (stale,
// another lock), Scan returns Check's errors and nothing is written, even
// when the caller commits; an accepted write of no row is sql.ErrNoRows and
// records the fence. Fence 0 and statements it cannot guard or that return
// nothing are refused in the client, before anything is sent.
func TestQueryRow(t *testing.T) {
	db, tbl := setup(t, servers[0])
	ctx := testContext(t)
	const insert = insertOrderPG + " RETURNING id"
	// write runs QueryRow in a transaction of its own and commits it
	// whatever Scan said: after a refusal the commit must not keep the
	// write (PostgreSQL rolls an aborted transaction back).
	write := func(tbl *fence.Table, query string, token int64, args ...any) (int64, error) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var id int64
		err = tbl.QueryRowLease(ctx, tx, lease{"r", 0, token}, query, args...).Scan(&id)
		if cerr := tx.Commit(); cerr != nil && (err == nil || errors.Is(err, sql.ErrNoRows)) {
			t.Fatal(cerr)
		}
		return id, err
	}
	first, err := write(tbl, insert, 5, "r", 5)
	if err != nil || first == 0 {
		t.Fatalf("fence 5: id %d, %v; want the new order's id", first, err)
	}
	again, err := write(tbl, insert, 5, "r", 5)
	if err != nil || again <= first {
		t.Fatalf("fence 5 again: id %d, %v; want an id after %d", again, err, first)
	}
	_, err = write(tbl, insert, 4, "r", 4)
	wantStale(t, err, "r", 0, 4, 5)
	_, err = write(tbl.LockName("etcd"), insert, 9, "r", 9)
	if !errors.Is(err, fence.ErrOtherLock) {
		t.Fatalf("another lock's fence 9: %v, want ErrOtherLock", err)
	}
	if _, err := write(tbl, insert, 0, "r", 0); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("fence 0: %v, want ErrNoFence", err)
	}
	if _, err := write(tbl, "UPDATE orders SET fence = $1 WHERE resource = $2 RETURNING id", 7, 7, "none"); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("an UPDATE of no row: %v, want sql.ErrNoRows", err)
	}
	if _, err := write(tbl, "SELECT $1::bigint", 8, 8); err == nil || !strings.Contains(err.Error(), "INSERT, UPDATE or DELETE") {
		t.Fatalf("a SELECT: %v, want Exec's refusal of the statement", err)
	}
	if _, err := write(tbl, insertOrderPG+" -- RETURNING id", 8, "r", 8); err == nil || !strings.Contains(err.Error(), "use Exec") {
		t.Fatalf("an INSERT without RETURNING (the word in a comment): %v, want a refusal that says to use Exec", err)
	}
	wantOrders(t, db, "r", 5, 5)
	wantRecorded(t, db, "r", 0, 7, "")

	// A stale write of many rows: nothing of it is kept.
	if _, err := write(tbl, "INSERT INTO orders (resource, fence) SELECT $1, g FROM generate_series(1, 100) g RETURNING id", 6, "r"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a stale write of 100 rows: %v, want ErrStale", err)
	}
	wantOrders(t, db, "r", 5, 5)

	mysqlDB, mysqlTbl := setup(t, servers[1])
	tx, err := execPool(t, mysqlDB).BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var id int64
	if err := mysqlTbl.QueryRow(ctx, tx, "r", 0, 1, insertOrder(servers[1]), "r", 1).Scan(&id); err == nil || !strings.Contains(err.Error(), "PostgreSQL") {
		t.Fatalf("QueryRow on MySQL: %v, want an error that says it is PostgreSQL's", err)
	}
}
