package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

var postgresKind, postgresSyncKind = postgresOf("postgres", false), postgresOf("postgres-sync", true)

// postgresOf is PostgreSQL, writing each commit to disk when sync.
func postgresOf(name string, sync bool) kind {
	k := postgres
	k.name = name
	k.sync = sync
	return k
}

var postgres = kind{
	driver: "pgx",
	start:  startPostgres,
	dsn:    postgresDSN,
	create: func(ctx context.Context, admin *sql.DB, db string) error {
		_, err := admin.ExecContext(ctx, `CREATE DATABASE "`+db+`"`)
		return err
	},
	drop: func(ctx context.Context, admin *sql.DB, db string) error {
		_, err := admin.ExecContext(ctx, `DROP DATABASE "`+db+`" WITH (FORCE)`)
		return err
	},
	session: `SELECT pg_backend_pid()::bigint`,
	waiting: `SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`,
	view:    `SELECT pid, state, wait_event_type, wait_event, query FROM pg_stat_activity WHERE backend_type = 'client backend'`,
	poll:    pollEvery,
}

func postgresDSN(port int, db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
}

// pgBin is where Debian's postgresql packages keep the server's programs.
const pgBin = "/usr/lib/postgresql/*/bin"

// startPostgres starts a server in dir; one that does not sync (the tests')
// skips fsync, the commit's wait for it and full-page writes.
func startPostgres(dir string, sync bool) (*process, int, error) {
	initdb, err := binary("initdb", "postgresql", pgBin)
	if err != nil {
		return nil, 0, err
	}
	postgresBin, err := binary("postgres", "postgresql", pgBin)
	if err != nil {
		return nil, 0, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, 0, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, 0, err
		}
	}
	data, log := filepath.Join(dir, "data"), filepath.Join(dir, "postgres.log")
	if err := run("initdb", initdb, []string{"-D", data, "-U", "postgres", "-A", "trust",
		"--no-sync", "-E", "UTF8", "--locale=C"}, dir, log, cred); err != nil {
		return nil, 0, err
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try a few
		port, err := proctest.FreePort()
		if err != nil {
			return nil, 0, err
		}
		args := []string{
			"-D", data, "-p", strconv.Itoa(port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + dir,
			"-c", "max_connections=200",
			// Deadlocks are found after this wait, not the default second.
			"-c", "deadlock_timeout=100ms",
		}
		if !sync {
			args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
		}
		p, err := serve("postgres 127.0.0.1:"+strconv.Itoa(port), postgresBin, args, dir, log, cred, syscall.SIGQUIT, "pgx", postgresDSN(port, ""))
		if err == nil {
			return p, port, nil
		}
		lastErr = err
	}
	return nil, 0, errors.Join(errors.New("start postgres"), lastErr)
}
