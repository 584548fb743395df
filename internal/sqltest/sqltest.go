// Package sqltest starts private PostgreSQL and MariaDB servers for tests.
//
// A test package gets one server of each kind it asks for, started on first
// use on a free loopback port with its data in a temporary directory (in
// memory where the machine has /dev/shm, but for the servers that sync), and
// killed (its directory removed) once the package's tests have run; each
// test gets a database of its own on it, so tests can run in parallel,
// dropped when the test ends.
// Servers are real processes from Debian's packages (postgresql,
// mariadb-server), tuned for speed (no fsync; PostgresSync and MySQLSync
// start servers that sync each commit): nothing here mocks SQL.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(sqltest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		db := sqltest.Postgres(t) // or sqltest.MySQL(t)
//		...
//	}
//
// PostgreSQL refuses to run as root: as root, initdb and postgres run as the
// user nobody. When a server is not installed, the test fails with a message
// that says how to install it; it never skips.
package sqltest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

// startTimeout bounds a server's setup (initdb, mariadb-install-db), its
// start and the creation of a test's database; pollEvery is how often a
// readiness wait pings, and a lock wait asks PostgreSQL.
const (
	startTimeout = 60 * time.Second
	pollEvery    = 5 * time.Millisecond
)

// DB is a database of a test's own on a private server, closed when the test
// ends.
type DB struct {
	*sql.DB
	Kind string // "postgres" or "mysql"; "postgres-sync" or "mysql-sync" for the servers that sync
	Name string // the database's name
	DSN  string // opens another pool on it: sql.Open(d.Driver(), d.DSN)
	srv  *server
}

// Driver is the database/sql driver name of d's DSN.
func (d *DB) Driver() string { return d.srv.kind.driver }

// Postgres returns a new empty database on the test package's private
// PostgreSQL server, starting the server on first use. It needs Main.
func Postgres(tb testing.TB) *DB { tb.Helper(); return newDB(tb, &postgresKind) }

// MySQL returns a new empty database on the test package's private MariaDB
// server, starting the server on first use. It needs Main.
func MySQL(tb testing.TB) *DB { tb.Helper(); return newDB(tb, &mysqlKind) }

// PostgresSync is Postgres on a second private server that writes each
// commit to disk before it answers (fsync, synchronous_commit and
// full_page_writes on), as production servers do: for a benchmark whose
// baseline must pay a commit's real cost.
func PostgresSync(tb testing.TB) *DB { tb.Helper(); return newDB(tb, &postgresSyncKind) }

// MySQLSync is MySQL on a second private server that writes each commit to
// disk before it answers (innodb_flush_log_at_trx_commit 1), as production
// servers do.
func MySQLSync(tb testing.TB) *DB { tb.Helper(); return newDB(tb, &mysqlSyncKind) }

// Main wraps a test package's *testing.M so that the servers its tests
// started are killed once the tests have run. Pass it to
// goleak.VerifyTestMain, or call its Run and os.Exit with the code.
func Main(m *testing.M) interface{ Run() int } { return mainM{m} }

type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	mu.Lock()
	mainRuns = true
	mu.Unlock()
	code := w.m.Run()
	stopAll()
	return code
}

var (
	mu       sync.Mutex
	mainRuns bool
	servers  = map[string]*server{} // by kind name; nil error: running
)

// server is one private server process and its admin connection.
type server struct {
	kind  *kind
	ready chan struct{} // closed once started or failed; then the fields below are set
	proc  *process
	dir   string
	port  int
	admin *sql.DB
	err   error // the failed start, reported to every test that asks
	n     int   // databases created
}

// kind is what differs between the two servers.
type kind struct {
	name, driver string
	// start sets up and starts a server in dir, syncing each commit when
	// sync, and returns its process and port.
	start func(dir string, sync bool) (*process, int, error)
	dsn   func(port int, db string) string
	// sync: the server writes each commit to disk before it answers, and
	// keeps its data on disk.
	sync bool
	// create creates database db; drop drops it, closing what is still
	// connected to it.
	create, drop func(ctx context.Context, admin *sql.DB, db string) error
	session      string // SQL: the server's id of the connection
	waiting      string // SQL with one argument, a session id: 1 row when it waits for a lock
	view         string // SQL: the server's view of sessions and their waits, for failures
	// poll is how often waiting may be asked: InnoDB refreshes what
	// information_schema.innodb_trx shows only when it was not read for
	// 100ms, so faster polls would see the same old rows forever.
	poll time.Duration
}

func newDB(tb testing.TB, k *kind) *DB {
	tb.Helper()
	s := acquire(tb, k)
	mu.Lock()
	s.n++
	name := fmt.Sprintf("test_%d", s.n)
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := k.create(ctx, s.admin, name); err != nil {
		tb.Fatalf("sqltest: create database %s on %s: %v", name, k.name, err)
	}
	tb.Cleanup(func() { // after the pools' Close, registered later
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		if err := k.drop(ctx, s.admin, name); err != nil {
			tb.Errorf("sqltest: drop database %s on %s: %v", name, k.name, err)
		}
	})
	dsn := k.dsn(s.port, name)
	db, err := sql.Open(k.driver, dsn)
	if err != nil {
		tb.Fatalf("sqltest: open %s: %v", dsn, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return &DB{DB: db, Kind: k.name, Name: name, DSN: dsn, srv: s}
}

// acquire returns the package's running server of kind k, starting it on
// first use (servers of two kinds start at once); a failed start fails
// every test that asks.
func acquire(tb testing.TB, k *kind) *server {
	tb.Helper()
	mu.Lock()
	if !mainRuns {
		mu.Unlock()
		tb.Fatalf("sqltest: the test package has no TestMain running sqltest.Main, which kills the servers: " +
			"func TestMain(m *testing.M) { goleak.VerifyTestMain(sqltest.Main(m)) }")
	}
	s := servers[k.name]
	if s == nil {
		s = &server{kind: k, ready: make(chan struct{})}
		servers[k.name] = s
		mu.Unlock()
		s.start()
		close(s.ready)
	} else {
		mu.Unlock()
		<-s.ready
	}
	if s.err != nil {
		tb.Fatalf("sqltest: %v", s.err)
	}
	return s
}

func (s *server) start() {
	mkdir := proctest.MkdirTemp
	if s.kind.sync { // its commits pay a disk's sync, as in production
		mkdir = func(pattern string) (string, error) { return os.MkdirTemp("", pattern) }
	}
	dir, err := mkdir("sqltest-" + s.kind.name + "-")
	if err != nil {
		s.err = err
		return
	}
	s.dir = dir
	if s.proc, s.port, s.err = s.kind.start(dir, s.kind.sync); s.err != nil {
		return
	}
	s.admin, s.err = sql.Open(s.kind.driver, s.kind.dsn(s.port, ""))
}

func stopAll() {
	mu.Lock()
	defer mu.Unlock()
	for name, s := range servers {
		<-s.ready // a test may have ended while its server started
		if s.admin != nil {
			_ = s.admin.Close()
		}
		if s.proc != nil {
			s.proc.kill()
		}
		if s.dir != "" {
			_ = os.RemoveAll(s.dir)
		}
		delete(servers, name)
	}
}

// Session returns the server's id of connection c (PostgreSQL's backend
// pid, MySQL's connection id), as its own views show it.
func (d *DB) Session(tb testing.TB, c *sql.Conn) int64 {
	tb.Helper()
	var id int64
	if err := c.QueryRowContext(context.Background(), d.srv.kind.session).Scan(&id); err != nil {
		tb.Fatalf("sqltest: session id: %v", err)
	}
	return id
}

// Waiting reports whether the server shows session waiting for a lock
// (PostgreSQL: pg_stat_activity's wait_event_type Lock; InnoDB:
// information_schema.innodb_trx's trx_state LOCK WAIT).
func (d *DB) Waiting(ctx context.Context, session int64) (bool, error) {
	rows, err := d.QueryContext(ctx, d.srv.kind.waiting, session)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	found := rows.Next()
	return found, rows.Err()
}

// WaitLockWait waits until the server shows session waiting for a lock, and
// fails the test when that has not happened within timeout.
func (d *DB) WaitLockWait(tb testing.TB, session int64, timeout time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		waiting, err := d.Waiting(ctx, session)
		if err == nil && waiting {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("sqltest: session %d of %s never waited for a lock within %v (last error: %v); the server shows:\n%s",
				session, d.Kind, timeout, err, d.view())
		case <-time.After(d.srv.kind.poll):
		}
	}
}

// view renders the server's view of its sessions, one line a row.
func (d *DB) view() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := d.QueryContext(ctx, d.srv.kind.view)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	fmt.Fprintln(&b, strings.Join(cols, " | "))
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return b.String() + err.Error()
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(v.String)
		}
		b.WriteString("\n")
	}
	return b.String()
}
