package sqltest_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(sqltest.Main(m)) }

// TestServers: each test gets its own empty database, on a server that
// answers, and the server's view shows a session blocked on another's row
// lock (and not before).
func TestServers(t *testing.T) {
	for _, open := range []func(testing.TB) *sqltest.DB{sqltest.Postgres, sqltest.MySQL} {
		a, b := open(t), open(t)
		t.Run(a.Kind, func(t *testing.T) {
			if a.Name == b.Name {
				t.Fatalf("two tests share database %s", a.Name)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			mustExec(t, a.DB, ctx, "CREATE TABLE t (id int PRIMARY KEY, v int)")
			mustExec(t, a.DB, ctx, "INSERT INTO t VALUES (1, 0)")
			if _, err := b.ExecContext(ctx, "SELECT v FROM t"); err == nil {
				t.Fatalf("%s: a table of database %s is seen from %s", a.Kind, a.Name, b.Name)
			}

			holder, waiter := conn(t, a.DB), conn(t, a.DB)
			id := a.Session(t, waiter)
			tx, err := holder.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			mustExec(t, tx, ctx, "UPDATE t SET v = 1 WHERE id = 1")
			if w, err := a.Waiting(ctx, id); err != nil || w {
				t.Fatalf("session %d waits before it asked for the row: %v, %v", id, w, err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := waiter.ExecContext(ctx, "UPDATE t SET v = 2 WHERE id = 1")
				done <- err
			}()
			a.WaitLockWait(t, id, 10*time.Second)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("the waiter never finished")
			}
		})
	}
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func mustExec(t *testing.T, db execer, ctx context.Context, q string) {
	t.Helper()
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func conn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSyncServers: PostgresSync and MySQLSync are servers of their own that
// write each commit to disk before answering; the tests' servers do not.
func TestSyncServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		open  func(testing.TB) *sqltest.DB
		query string
		want  string
	}{
		{sqltest.Postgres, "SELECT current_setting('fsync') || ' ' || current_setting('synchronous_commit')", "off off"},
		{sqltest.PostgresSync, "SELECT current_setting('fsync') || ' ' || current_setting('synchronous_commit')", "on on"},
		{sqltest.MySQL, "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit", "0"},
		{sqltest.MySQLSync, "SELECT @@GLOBAL.innodb_flush_log_at_trx_commit", "1"},
	} {
		db := c.open(t)
		var got string
		if err := db.QueryRowContext(ctx, c.query).Scan(&got); err != nil || got != c.want {
			t.Errorf("%s (%s): %s = %q (%v), want %q", db.Kind, db.Name, c.query, got, err, c.want)
		}
	}
}

// TestDataAndDrop: the tests' servers keep their data where
// proctest.MkdirTemp puts it (in memory where the machine has /dev/shm), the
// servers that sync in os.TempDir(), on disk; a test's database is
// dropped when the test ends, even while another pool holds a transaction
// open on it.
func TestDataAndDrop(t *testing.T) {
	t.Parallel()
	probe, err := proctest.MkdirTemp("probe-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(probe)
	bulk := filepath.Dir(probe) + string(filepath.Separator)
	for _, c := range []struct {
		kind           string
		open           func(testing.TB) *sqltest.DB
		dataDir, count string
	}{
		{"postgres", sqltest.Postgres, "SHOW data_directory", "SELECT count(*) FROM pg_database WHERE datname = $1"},
		{"postgres-sync", sqltest.PostgresSync, "SHOW data_directory", "SELECT count(*) FROM pg_database WHERE datname = $1"},
		{"mysql", sqltest.MySQL, "SELECT @@datadir", "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?"},
		{"mysql-sync", sqltest.MySQLSync, "SELECT @@datadir", "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?"},
	} {
		ctx := context.Background()
		var name string
		t.Run(c.kind, func(t *testing.T) {
			var other *sql.DB
			var tx *sql.Tx
			t.Cleanup(func() { // after the database's drop, registered later
				if tx != nil {
					_ = tx.Rollback() // its session is gone
				}
				if other != nil {
					_ = other.Close()
				}
			})
			db := c.open(t)
			name = db.Name
			var dir string
			if err := db.QueryRowContext(ctx, c.dataDir).Scan(&dir); err != nil {
				t.Fatal(err)
			}
			sync := strings.HasSuffix(db.Kind, "-sync")
			want := bulk
			if sync {
				want = os.TempDir() + string(filepath.Separator)
			}
			if !strings.HasPrefix(dir, want) {
				t.Errorf("%s keeps its data in %s, want it in %s", db.Kind, dir, want)
			}
			mustExec(t, db.DB, ctx, "CREATE TABLE t (id int PRIMARY KEY)") // MySQL commits at a CREATE
			var err error
			if other, err = sql.Open(db.Driver(), db.DSN); err != nil {
				t.Fatal(err)
			}
			if tx, err = other.BeginTx(ctx, nil); err != nil {
				t.Fatal(err)
			}
			mustExec(t, tx, ctx, "INSERT INTO t VALUES (1)")
		})
		var n int
		if err := c.open(t).QueryRowContext(ctx, c.count, name).Scan(&n); err != nil || n != 0 {
			t.Errorf("database %s is there after its test (%d, %v)", name, n, err)
		}
	}
}
