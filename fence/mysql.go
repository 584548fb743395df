package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// mysql is MySQL and MariaDB with InnoDB.
//
// INSERT ... ON DUPLICATE KEY UPDATE takes the row's exclusive lock and
// changes the latest version (not the REPEATABLE READ snapshot) only when the
// fence is not lower and the lock name is the same. Its affected-row count
// (0, 1 or 2, and 1 for an unchanged row under clientFoundRows) says too
// little, so the statement says its verdict in the insert id of its own
// answer, through LAST_INSERT_ID(expr), from the row it judged under the
// row's lock: 0 when it inserted the row (the table has no AUTO_INCREMENT),
// the token when it accepted it, and something else when it refused (the
// higher fence it found, or the token + 1 for another lock's row). One round
// trip then decides an accepted check; only a refusal reads the locked row
// again, for the fence and lock name its error reports.
//
// resource and lock_name are VARBINARY: compared byte for byte, without the
// case folding and trailing-space padding of the default collations, which
// would give two resources one fence.
type mysql struct{}

const (
	mysqlMaxResource = 512
	mysqlMaxLock     = 255
)

func (mysql) quote(id string) string { return "`" + id + "`" }

func (mysql) statements(table string) statements {
	return statements{
		ddl: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	resource  VARBINARY(%d) NOT NULL,
	permit    INT NOT NULL,
	lock_name VARBINARY(%d) NOT NULL,
	fence     BIGINT NOT NULL,
	PRIMARY KEY (resource, permit)
) ENGINE=InnoDB`, table, mysqlMaxResource, mysqlMaxLock),
		accept: fmt.Sprintf(`INSERT INTO %s (resource, permit, lock_name, fence) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE fence = IF(lock_name = VALUES(lock_name),
	IF(fence <= VALUES(fence), LAST_INSERT_ID(VALUES(fence)), LAST_INSERT_ID(fence)),
	fence + 0 * LAST_INSERT_ID(VALUES(fence) + 1))`, table),
		read: fmt.Sprintf(`SELECT fence, lock_name FROM %s WHERE resource = ? AND permit = ? FOR UPDATE`, table),
		guard: fmt.Sprintf(`INSERT INTO %s (resource, permit, lock_name, fence) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE fence = IF(lock_name = VALUES(lock_name) AND fence <= VALUES(fence), VALUES(fence),
	~0 + (fence = fence))`, table),
	}
}

// validate refuses what the columns would truncate (silently, outside strict
// mode): two long resources would share a fence.
func (mysql) validate(resource, lock string) error {
	if len(resource) > mysqlMaxResource {
		return fmt.Errorf("fence: resource %.40q...: %d bytes, more than MySQL's column holds (%d)", resource, len(resource), mysqlMaxResource)
	}
	if len(lock) > mysqlMaxLock {
		return fmt.Errorf("fence: lock name %.40q...: %d bytes, more than MySQL's column holds (%d)", lock, len(lock), mysqlMaxLock)
	}
	return nil
}

func (mysql) check(ctx context.Context, r runner, s statements, resource string, permit int, lock string, token int64) (int64, string, error) {
	if x, ok := r.(resulter); ok {
		id, err := x.execID(ctx, s.accept, resource, permit, lock, token)
		if err != nil {
			return 0, "", err
		}
		if id == 0 || id == token {
			return token, lock, nil // inserted, or accepted
		}
	} else if err := r.Exec(ctx, s.accept, resource, permit, lock, token); err != nil {
		return 0, "", err
	}
	var current int64
	var recorded []byte
	if err := r.QueryRow(ctx, s.read, resource, permit).Scan(&current, &recorded); err != nil {
		return 0, "", err
	}
	return current, string(recorded), nil
}

// resulter is a runner that gives a statement's insert id (database/sql's).
type resulter interface {
	execID(ctx context.Context, query string, args ...any) (int64, error)
}

// exec sends the check (guard) and query as one multi-statement query:
// MySQL runs them in order and stops at the first error, and the check
// fails on a refusal, so query runs only after the check accepted token and
// locked the row. The refusal is an integer overflow: ~0 is the largest
// BIGINT UNSIGNED, and adding 1 to it fails with error 1690 whatever the
// sql_mode (MySQL since 5.5.5; tested on MariaDB in four modes). The 1 is
// (fence = fence), so that the sum is worked out only in the refusing
// branch; it costs less than a scalar subquery of two rows (error 1242).
// Each statement of such a query outside a transaction would commit apart,
// the check before the write: q must be a *sql.Tx. A failed check leaves
// the transaction usable, so the verdict is read from the row, under its
// lock, only when the error is 1690 (query's own 1690 finds token accepted,
// and is returned as it is).
func (mysql) exec(ctx context.Context, t *Table, q Querier, resource string, permit int, token int64, query string, args []any) (sql.Result, error) {
	if _, ok := q.(*sql.Tx); !ok {
		return nil, fmt.Errorf("fence: Exec on MySQL or MariaDB takes a *sql.Tx, not %T: outside a transaction the check would commit apart from the write", q)
	}
	all := append([]any{resource, permit, t.lock, token}, args...)
	res, err := q.ExecContext(ctx, t.stmts.guard+";\n"+query, all...)
	if err == nil {
		return res, nil
	}
	n, _ := mysqlNumber(err)
	switch n {
	case 1690:
		var current int64
		var recorded []byte
		if q.QueryRowContext(ctx, t.stmts.read, resource, permit).Scan(&current, &recorded) == nil {
			if v := t.verdict(resource, permit, token, current, string(recorded)); errors.Is(v, ErrStale) || errors.Is(v, ErrOtherLock) {
				return nil, v
			}
		}
	case 1064: // a syntax error: a pool without multiStatements, say
		err = fmt.Errorf("%w (Exec sends the check and the statement as one query: the pool's DSN needs multiStatements=true and interpolateParams=true)", err)
	}
	return nil, t.failed(resource, permit, err)
}
