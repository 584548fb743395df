package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// postgres is PostgreSQL.
//
// The accepting statement is one upsert. ON CONFLICT DO UPDATE locks the
// conflicting row even when its WHERE is false, and at READ COMMITTED it
// waits for a concurrent holder of the row and then judges the latest
// version; at REPEATABLE READ and SERIALIZABLE a row changed since the
// snapshot fails with 40001 instead. So a row returned means accepted, and
// only a refusal costs a second statement, which reads the locked row.
type postgres struct{}

func (postgres) quote(id string) string { return `"` + id + `"` }

func (postgres) statements(table string) statements {
	return statements{
		ddl: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	resource  text    NOT NULL,
	permit    integer NOT NULL CHECK (permit >= 0),
	lock_name text    NOT NULL,
	fence     bigint  NOT NULL CHECK (fence > 0),
	PRIMARY KEY (resource, permit)
)`, table),
		accept: fmt.Sprintf(`INSERT INTO %s AS f (resource, permit, lock_name, fence) VALUES ($1, $2, $3, $4)
ON CONFLICT (resource, permit) DO UPDATE SET fence = EXCLUDED.fence
WHERE f.lock_name = EXCLUDED.lock_name AND f.fence <= EXCLUDED.fence
RETURNING f.fence`, table),
		read: fmt.Sprintf(`SELECT fence, lock_name FROM %s WHERE resource = $1 AND permit = $2 FOR UPDATE`, table),
	}
}

func (postgres) validate(resource, lock string) error { return nil }

func (postgres) check(ctx context.Context, r runner, s statements, resource string, permit int, lock string, token int64) (int64, string, error) {
	var current int64
	err := r.QueryRow(ctx, s.accept, resource, permit, lock, token).Scan(&current)
	if err == nil {
		return current, lock, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, "", err
	}
	var recorded string
	if err := r.QueryRow(ctx, s.read, resource, permit).Scan(&current, &recorded); err != nil {
		return 0, "", err
	}
	return current, recorded, nil
}
