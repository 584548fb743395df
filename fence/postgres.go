package fence

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// exec runs query with the check in front of it (guard). A refusal's error
// carries the row's fence and lock name: nothing can be read after it in an
// aborted transaction.
func (d postgres) exec(ctx context.Context, t *Table, q Querier, resource string, permit int, token int64, query string, args []any) (sql.Result, error) {
	fenced, all, _, err := d.fenced(t, resource, permit, token, query, args)
	if err != nil {
		return nil, err
	}
	res, err := q.ExecContext(ctx, fenced, all...)
	if err != nil {
		return nil, d.execErr(t, resource, permit, token, err)
	}
	return res, nil
}

// fenced returns query with the check in front of it (guard), the
// arguments of both, and whether query has a RETURNING clause.
func (d postgres) fenced(t *Table, resource string, permit int, token int64, query string, args []any) (string, []any, bool, error) {
	fenced, returns, err := d.guard(t.quote, query, len(args))
	if err != nil {
		return "", nil, false, err
	}
	return fenced, append(args[:len(args):len(args)], resource, permit, t.lock, token), returns, nil
}

// execErr is Exec's error for err, the fenced statement's: a refusal's
// verdict, or err.
func (postgres) execErr(t *Table, resource string, permit int, token int64, err error) error {
	if current, lock, ok := refusal(err); ok {
		if v := t.verdict(resource, permit, token, current, lock); v != nil {
			return v
		}
	}
	return t.failed(resource, permit, err)
}

// guard returns query, a statement with nargs arguments ($1…$nargs), with
// the check in front of it: a data-modifying WITH, which PostgreSQL runs to
// completion (after the statement's own write) even though the statement
// does not read it, with the check's arguments after the statement's
// (resource, permit, lock name, token). Its upsert always updates a row it
// finds, and when the row's fence is higher or its lock name another it
// sets the fence to a cast that fails, on text that carries the row's
// fence and lock name (refusal reads them): the error aborts the whole
// statement, the caller's write with it. returns says whether query has a
// RETURNING clause.
func (postgres) guard(table, query string, nargs int) (fenced string, returns bool, err error) {
	if returns, err = pgWrite(query, nargs); err != nil {
		return "", false, err
	}
	n := nargs
	return fmt.Sprintf(`WITH lockstep_fence AS (INSERT INTO %s AS f (resource, permit, lock_name, fence) VALUES ($%d, $%d, $%d, $%d)
ON CONFLICT (resource, permit) DO UPDATE SET fence = CASE
WHEN f.lock_name = EXCLUDED.lock_name AND f.fence <= EXCLUDED.fence THEN EXCLUDED.fence
ELSE ('%s' || f.fence || ' ' || encode(convert_to(f.lock_name, 'UTF8'), 'hex') || '%s')::bigint END)
`, table, n+1, n+2, n+3, n+4, refusedMark, refusedEnd) + query, returns, nil
}

// pgWrite accepts query if the check's WITH can guard it: one INSERT,
// UPDATE or DELETE (blanks and comments aside, and one final semicolon)
// whose placeholders are $1…$nargs, no more; returns says whether it has a
// RETURNING clause (a reserved word: unquoted, it is the keyword).
func pgWrite(query string, nargs int) (returns bool, err error) {
	first, several, most, returns := pgScan(query)
	switch strings.ToLower(first) {
	case "insert", "update", "delete":
	case "with":
		return false, errors.New("fence: Exec: the statement starts with WITH, and the check's WITH must be the statement's first: use Check in the statement's transaction")
	case "":
		return false, errors.New("fence: Exec: no statement")
	default:
		return false, fmt.Errorf("fence: Exec takes one INSERT, UPDATE or DELETE, not a statement that starts with %q: use Check in its transaction", first)
	}
	if several {
		return false, errors.New("fence: Exec takes one statement, and the query has more after a semicolon: use Check in their transaction")
	}
	if most > nargs {
		return false, fmt.Errorf("fence: Exec: the statement has placeholder $%d but %d arguments", most, nargs)
	}
	return returns, nil
}

// pgScan reads a PostgreSQL statement as the server's lexer would, as far
// as telling code from comments, strings and quoted identifiers goes: it
// returns the statement's first word, whether code follows a semicolon,
// the highest placeholder ($n) in it and whether the word RETURNING is in
// its code.
func pgScan(q string) (first string, several bool, most int, returning bool) {
	ident := func(c byte) bool {
		return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
	}
	ended := false // a semicolon was seen outside strings and comments
	code := func() { several = several || ended }
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case strings.HasPrefix(q[i:], "--"):
			if j := strings.IndexByte(q[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(q)
			}
		case strings.HasPrefix(q[i:], "/*"): // comments nest
			depth := 0
			for i < len(q) {
				if strings.HasPrefix(q[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(q[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == ';':
			ended = true
			i++
		case c == '\'' || c == '"':
			code()
			// E'...' takes backslash escapes; '' and "" are the quote itself.
			escapes := c == '\'' && i > 0 && (q[i-1] == 'E' || q[i-1] == 'e') && (i == 1 || !ident(q[i-2]))
			for i++; i < len(q); i++ {
				if escapes && q[i] == '\\' {
					i++
				} else if q[i] == c {
					if i+1 < len(q) && q[i+1] == c {
						i++
					} else {
						break
					}
				}
			}
			i++
		case c == '$' && (i == 0 || !ident(q[i-1])):
			code()
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			if j > i+1 { // a placeholder
				if n, err := strconv.Atoi(q[i+1 : j]); err == nil && n > most {
					most = n
				} else if err != nil {
					most = int(^uint(0) >> 1)
				}
				i = j
				continue
			}
			for j < len(q) && ident(q[j]) && q[j] != '$' {
				j++
			}
			if j < len(q) && q[j] == '$' && (j == i+1 || !(q[i+1] >= '0' && q[i+1] <= '9')) { // $tag$ … $tag$
				tag := q[i : j+1]
				if k := strings.Index(q[j+1:], tag); k >= 0 {
					i = j + 1 + k + len(tag)
				} else {
					i = len(q)
				}
				continue
			}
			i++
		case ident(c):
			code()
			j := i
			for j < len(q) && ident(q[j]) {
				j++
			}
			if first == "" {
				first = q[i:j]
			}
			returning = returning || strings.EqualFold(q[i:j], "returning")
			i = j
		default:
			code()
			if first == "" {
				first = q[i : i+1]
			}
			i++
		}
	}
	return first, several, most, returning
}

// refusedMark starts what a refusing guard puts in its error: the recorded
// fence and the hex of the recorded lock name, then refusedEnd. The server
// quotes it in the message of the cast that fails on it, in any language.
const (
	refusedMark = "lockstep_fence refused: "
	refusedEnd  = " ."
)

// refusal reads the fence and lock name a refusing guard reported in err.
func refusal(err error) (current int64, lock string, ok bool) {
	msg := err.Error()
	i := strings.Index(msg, refusedMark)
	if i < 0 {
		return 0, "", false
	}
	rest := msg[i+len(refusedMark):]
	j := strings.Index(rest, refusedEnd)
	if j < 0 {
		return 0, "", false
	}
	num, hexLock, found := strings.Cut(rest[:j], " ")
	if !found {
		return 0, "", false
	}
	current, perr := strconv.ParseInt(num, 10, 64)
	b, herr := hex.DecodeString(hexLock)
	if perr != nil || herr != nil {
		return 0, "", false
	}
	return current, string(b), true
}
