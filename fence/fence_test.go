package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// server is one SQL server kind the tests run on.
type server struct {
	name     string
	open     func(testing.TB) *sqltest.DB
	openSync func(testing.TB) *sqltest.DB // a server that syncs each commit (benchmarks)
	table    func(string) *fence.Table
}

var servers = []server{
	{"postgres", sqltest.Postgres, sqltest.PostgresSync, fence.Postgres},
	{"mysql", sqltest.MySQL, sqltest.MySQLSync, fence.MySQL},
}

// each runs f as a parallel subtest per server.
func each(t *testing.T, f func(t *testing.T, s server)) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f(t, s)
		})
	}
}

const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// setup opens a database of the test's own with a fence table "fences" and
// a business table "orders" (the write a fence guards).
func setup(t *testing.T, s server) (*sqltest.DB, *fence.Table) {
	t.Helper()
	db := s.open(t)
	tbl := s.table("fences")
	ctx := testContext(t)
	if err := tbl.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	orders := "CREATE TABLE orders (id serial PRIMARY KEY, resource text NOT NULL, fence bigint NOT NULL)"
	if s.name == "mysql" {
		orders = "CREATE TABLE orders (id int AUTO_INCREMENT PRIMARY KEY, resource varchar(100) NOT NULL, fence bigint NOT NULL) ENGINE=InnoDB"
	}
	if _, err := db.ExecContext(ctx, orders); err != nil {
		t.Fatal(err)
	}
	return db, tbl
}

// recorded returns the fence row of (resource, permit): its fence and lock
// name, or 0 and "" when there is none.
func recorded(t *testing.T, db *sqltest.DB, resource string, permit int) (int64, string) {
	t.Helper()
	q := "SELECT fence, lock_name FROM fences WHERE resource = $1 AND permit = $2"
	if db.Kind == "mysql" {
		q = strings.ReplaceAll(strings.ReplaceAll(q, "$1", "?"), "$2", "?")
	}
	var f int64
	var lock []byte
	err := db.QueryRowContext(testContext(t), q, resource, permit).Scan(&f, &lock)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return f, string(lock)
}

func wantRecorded(t *testing.T, db *sqltest.DB, resource string, permit int, fence int64, lock string) {
	t.Helper()
	if f, l := recorded(t, db, resource, permit); f != fence || l != lock {
		t.Fatalf("%s permit %d: recorded fence %d of lock %q, want %d of %q", resource, permit, f, l, fence, lock)
	}
}

func wantStale(t *testing.T, err error, resource string, permit int, token, current int64) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("check of %d: got %v, want a *fence.StaleError", token, err)
	}
	want := fence.StaleError{Resource: resource, Permit: permit, Token: token, Current: current}
	if *se != want {
		t.Fatalf("stale error %+v, want %+v", *se, want)
	}
	if !errors.Is(err, fence.ErrStale) || errors.Is(err, fence.ErrOtherLock) || fence.IsRetryable(err) {
		t.Fatalf("%v: Is(ErrStale) %v, Is(ErrOtherLock) %v, retryable %v; want true, false, false",
			err, errors.Is(err, fence.ErrStale), errors.Is(err, fence.ErrOtherLock), fence.IsRetryable(err))
	}
}

// TestCheck: a new resource is accepted, the same fence again too (a holder
// writes more than once), a higher one too, a lower one is refused with the
// current fence; permits count apart; a refusal records nothing.
func TestCheck(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		const res = "lock:order:42"
		for _, step := range []struct {
			permit       int
			token, after int64
			stale        bool
		}{
			{0, 5, 5, false}, // new resource
			{0, 5, 5, false}, // equal: the same holder writes again
			{0, 7, 7, false}, // a newer holder
			{0, 6, 7, true},  // an older holder
			{0, 5, 7, true},
			{0, 7, 7, false},
			{1, 2, 2, false}, // another permit has fences of its own
			{1, 1, 2, true},
			{0, 8, 8, false},
		} {
			err := tbl.Check(ctx, db, res, step.permit, step.token)
			if step.stale {
				wantStale(t, err, res, step.permit, step.token, step.after)
			} else if err != nil {
				t.Fatalf("check %d on permit %d: %v", step.token, step.permit, err)
			}
			wantRecorded(t, db, res, step.permit, step.after, "")
		}
		// Resources are compared byte for byte: no case folding or padding.
		for _, other := range []string{"LOCK:ORDER:42", res + " "} {
			if err := tbl.Check(ctx, db, other, 0, 1); err != nil {
				t.Fatalf("%q shares %q's fence: %v", other, res, err)
			}
		}
	})
}

// TestNoFence: a caller without a lock (fence 0 or less) is refused, and
// nothing is recorded.
func TestNoFence(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		for _, token := range []int64{0, -1} {
			err := tbl.Check(ctx, db, "r", 0, token)
			if !errors.Is(err, fence.ErrNoFence) || errors.Is(err, fence.ErrStale) || fence.IsRetryable(err) {
				t.Fatalf("check of %d: %v, want ErrNoFence, not stale, not retryable", token, err)
			}
			if !strings.Contains(err.Error(), "without a lock") {
				t.Fatalf("the error does not say why: %v", err)
			}
		}
		wantRecorded(t, db, "r", 0, 0, "")
		if err := tbl.Check(ctx, db, "", 0, 3); err == nil {
			t.Fatal("an empty resource was accepted")
		}
		if err := tbl.Check(ctx, db, "r", -1, 3); err == nil {
			t.Fatal("a negative permit was accepted")
		}
	})
}

// TestOtherLock: a resource fenced by one lock is refused to another lock's
// fence, however high, with an error that names both; nothing changes.
func TestOtherLock(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		redis, etcd := tbl.LockName("redis"), tbl.LockName("etcd")
		if err := redis.Check(ctx, db, "r", 0, 5); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			t    *fence.Table
			lock string
		}{{etcd, "etcd"}, {tbl, ""}} {
			for _, token := range []int64{4, 5, 1 << 40} {
				err := c.t.Check(ctx, db, "r", 0, token)
				var oe *fence.OtherLockError
				if !errors.As(err, &oe) || *oe != (fence.OtherLockError{Resource: "r", Permit: 0, Lock: c.lock, Recorded: "redis"}) {
					t.Fatalf("lock %q, fence %d: got %v, want an OtherLockError", c.lock, token, err)
				}
				if !errors.Is(err, fence.ErrOtherLock) || errors.Is(err, fence.ErrStale) || fence.IsRetryable(err) {
					t.Fatalf("%v: want ErrOtherLock only, not retryable", err)
				}
				if !strings.Contains(err.Error(), `"redis"`) || !strings.Contains(err.Error(), `"`+c.lock+`"`) {
					t.Fatalf("the error does not name both locks: %v", err)
				}
			}
		}
		wantRecorded(t, db, "r", 0, 5, "redis")
		if err := redis.Check(ctx, db, "r", 0, 6); err != nil {
			t.Fatalf("the resource's own lock is refused after another's check: %v", err)
		}
		if err := etcd.Check(ctx, db, "s", 0, 1); err != nil {
			t.Fatalf("another resource: %v", err)
		}
		wantRecorded(t, db, "s", 0, 1, "etcd")
	})
}

// TestRollback: a check is part of its transaction: a higher fence rolled
// back leaves the fence where it was, and so does the business write.
func TestRollback(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		if err := tbl.Check(ctx, db, "r", 0, 5); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Check(ctx, tx, "r", 0, 10); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, insertOrder(s), "r", 10); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, db, "r", 0, 5, "")
		if err := tbl.Check(ctx, db, "r", 0, 8); err != nil {
			t.Fatalf("fence 8 after 10 was rolled back: %v", err)
		}
		wantOrders(t, db, "r")
	})
}

// TestCreate: Create is idempotent and DDL is what it runs; an invalid
// table name is an error from every method, not a panic or an injection.
func TestCreate(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		if err := tbl.Create(ctx, db); err != nil {
			t.Fatalf("second Create: %v", err)
		}
		if !strings.HasPrefix(tbl.DDL(), "CREATE TABLE IF NOT EXISTS ") {
			t.Fatalf("DDL: %s", tbl.DDL())
		}
		other := s.table(db.Name + ".other_fences") // schema- or database-qualified
		if s.name == "postgres" {
			other = s.table("public.other_fences")
		}
		if err := other.Create(ctx, db); err != nil {
			t.Fatal(err)
		}
		if err := other.Check(ctx, db, "r", 0, 1); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"", "fences; DROP TABLE orders", `a"b`, "a.b.c", "1x"} {
			bad := s.table(name)
			if err := bad.Create(ctx, db); err == nil {
				t.Fatalf("Create with table name %q: no error", name)
			}
			if err := bad.Check(ctx, db, "r", 0, 1); err == nil {
				t.Fatalf("Check with table name %q: no error", name)
			}
		}
		wantOrders(t, db, "r")
	})
}

// lease is what a holder has, e.g. a *lockstep.Lease.
type lease struct {
	key    string
	permit int
	fence  int64
}

func (l lease) Key() string  { return l.key }
func (l lease) Permit() int  { return l.permit }
func (l lease) Fence() int64 { return l.fence }

func TestCheckLease(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		db, tbl := setup(t, s)
		ctx := testContext(t)
		if err := tbl.CheckLease(ctx, db, lease{"k", 2, 9}); err != nil {
			t.Fatal(err)
		}
		wantRecorded(t, db, "k", 2, 9, "")
		wantStale(t, tbl.CheckLease(ctx, db, lease{"k", 2, 8}), "k", 2, 8, 9)
	})
}

func insertOrder(s server) string {
	if s.name == "mysql" {
		return "INSERT INTO orders (resource, fence) VALUES (?, ?)"
	}
	return "INSERT INTO orders (resource, fence) VALUES ($1, $2)"
}

// wantOrders checks the fences of resource's committed orders, in the order
// they were written.
func wantOrders(t *testing.T, db *sqltest.DB, resource string, fences ...int64) {
	t.Helper()
	q := "SELECT fence FROM orders WHERE resource = $1 ORDER BY id"
	if db.Kind == "mysql" {
		q = strings.ReplaceAll(q, "$1", "?")
	}
	rows, err := db.QueryContext(testContext(t), q, resource)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []int64
	for rows.Next() {
		var f int64
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(fences) {
		t.Fatalf("orders of %s have fences %v, want %v", resource, got, fences)
	}
	for i := range got {
		if got[i] != fences[i] {
			t.Fatalf("orders of %s have fences %v, want %v", resource, got, fences)
		}
	}
}
