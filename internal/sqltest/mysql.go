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
	"time"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

var mysqlKind, mysqlSyncKind = mysqlOf("mysql", false), mysqlOf("mysql-sync", true)

// mysqlOf is MariaDB, writing each commit to disk when sync.
func mysqlOf(name string, sync bool) kind {
	k := mariadb
	k.name = name
	k.sync = sync
	return k
}

var mariadb = kind{
	driver: "mysql",
	start:  startMySQL,
	dsn:    mysqlDSN,
	create: func(ctx context.Context, admin *sql.DB, db string) error {
		_, err := admin.ExecContext(ctx, "CREATE DATABASE `"+db+"`")
		return err
	},
	drop: func(ctx context.Context, admin *sql.DB, db string) error {
		// A session left connected inside a transaction would make the drop
		// wait for its locks: the database's sessions are killed first.
		rows, err := admin.QueryContext(ctx, "SELECT id FROM information_schema.processlist WHERE db = ?", db)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			_, _ = admin.ExecContext(ctx, "KILL ?", id) // it may have ended meanwhile
		}
		_, err = admin.ExecContext(ctx, "DROP DATABASE `"+db+"`")
		return err
	},
	session: `SELECT CONNECTION_ID()`,
	waiting: `SELECT 1 FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'`,
	view: `SELECT p.id, p.command, p.state, t.trx_state, p.info FROM information_schema.processlist p
		LEFT JOIN information_schema.innodb_trx t ON t.trx_mysql_thread_id = p.id`,
	poll: 150 * time.Millisecond,
}

func mysqlDSN(port int, db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", port, db)
}

// startMySQL starts a server in dir; one that does not sync (the tests')
// writes its log to disk about once a second rather than at each commit.
func startMySQL(dir string, sync bool) (*process, int, error) {
	install, err := binary("mariadb-install-db", "mariadb-server")
	if err != nil {
		return nil, 0, err
	}
	mariadbd, err := binary("mariadbd", "mariadb-server", "/usr/sbin")
	if err != nil {
		return nil, 0, err
	}
	// mariadbd runs as root only when told to; it needs no other user.
	var asUser []string
	if os.Geteuid() == 0 {
		asUser = []string{"--user=root"}
	}
	flush := "0"
	if sync {
		flush = "1"
	}
	data, log := filepath.Join(dir, "data"), filepath.Join(dir, "mariadb.log")
	if err := run("mariadb-install-db", install, append([]string{"--no-defaults", "--datadir=" + data,
		"--auth-root-authentication-method=normal", "--skip-test-db"}, asUser...), dir, log, nil); err != nil {
		return nil, 0, err
	}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try a few
		port, err := proctest.FreePort()
		if err != nil {
			return nil, 0, err
		}
		p, err := serve("mariadbd 127.0.0.1:"+strconv.Itoa(port), mariadbd, append([]string{
			"--no-defaults", "--datadir=" + data,
			"--socket=" + filepath.Join(dir, "mariadb.sock"), "--pid-file=" + filepath.Join(dir, "mariadb.pid"),
			"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
			"--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=" + flush,
			"--max-connections=200",
			// A test that leaves a lock wait behind fails in seconds, not 50.
			"--innodb-lock-wait-timeout=10",
		}, asUser...), dir, log, nil, syscall.SIGKILL, "mysql", mysqlDSN(port, ""))
		if err == nil {
			return p, port, nil
		}
		lastErr = err
	}
	return nil, 0, errors.Join(errors.New("start mariadbd"), lastErr)
}
