package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// BenchmarkFencedWrite is a write transaction (BEGIN, INSERT an order,
// COMMIT) with and without a fence check in it, on the same private server,
// from 1 and 16 connections. The two take turns in rounds (a tenth of b.N
// writes of each, the first alternating), so that other work on the machine
// weighs on both alike; an op is one write of each. It reports the time per
// write of each (fenced-ns, unfenced-ns), their ratio over the run
// (x-unfenced-total) and the median of the rounds' ratios (x-unfenced).
//
// sync=on is a server that writes each commit to disk before it answers, as
// production servers do (sqltest.PostgresSync, sqltest.MySQLSync); sync=off
// is the tests' server, which does not, so its commits cost less than in
// production.
//
// It runs a second time with the check in the INSERT's own round trip
// (Table.Exec; postgres-exec, mysql-exec), so that the fenced transaction
// takes the bare one's round trips: BEGIN, the INSERT, COMMIT. MySQL's
// runs on a pool with multiStatements and interpolateParams, as Exec needs,
// its bare writes too. At sync=on a third time (postgres-record,
// mysql-record) the "fenced" write is Exec's without its check: the fence
// row upserted unconditionally in the INSERT's round trip (recordFence),
// the least a fence recorded in the caller's transaction costs; Exec's
// x-unfenced beside it is the check's own share. And at sync=on a fourth
// time with Exec on a write of five rows (rows=5: one INSERT of five orders)
// instead of one, a transaction that does more than the smallest write.
//
// Each write is a new holder, with a higher fence: spread=true takes the
// connection's spreadResources resources in turn, as holders of many
// resources do (a fence row is written once per spreadResources writes of
// its connection); spread=false writes one resource per connection, its
// fence row updated at every write, a resource taken thousands of times a
// second (sync=off only).
//
//	go test -run '^$' -bench FencedWrite -benchtime 2s ./fence
func BenchmarkFencedWrite(b *testing.B) {
	type mode struct {
		sync, spread bool
	}
	for _, s := range servers {
		for _, m := range []mode{{true, true}, {false, true}, {false, false}} {
			for _, conns := range []int{1, 16} {
				open := s.open
				if m.sync {
					open = s.openSync
				}
				db := open(b)
				tbl := s.table("fences")
				ctx := context.Background()
				if err := tbl.Create(ctx, db); err != nil {
					b.Fatal(err)
				}
				orders := "CREATE TABLE orders (id bigserial PRIMARY KEY, resource text NOT NULL, fence bigint NOT NULL)"
				if s.name == "mysql" {
					orders = "CREATE TABLE orders (id bigint AUTO_INCREMENT PRIMARY KEY, resource varchar(100) NOT NULL, fence bigint NOT NULL) ENGINE=InnoDB"
				}
				if _, err := db.ExecContext(ctx, orders); err != nil {
					b.Fatal(err)
				}
				db.SetMaxOpenConns(conns)
				db.SetMaxIdleConns(conns)
				syncing := "off"
				if m.sync {
					syncing = "on"
				}
				// Across the runs of b.N: each connection's own resources,
				// and fences that only grow.
				var next, tokens atomic.Int64
				// holder writes as one connection does, on pool: each call
				// the next holder, on its next resource.
				holder := func(pool *sql.DB, way fenceWay, rows int) func() error {
					base, i := next.Add(1), 0
					return func() error {
						resource := fmt.Sprintf("r%d", base)
						if m.spread {
							resource = fmt.Sprintf("r%d-%d", base, i%spreadResources)
							i++
						}
						return benchWrite(ctx, pool, s, tbl, way, resource, tokens.Add(1), rows)
					}
				}
				// Exec's rows run on Exec's pool, their bare writes too:
				// MySQL's interpolates arguments in the client, which saves
				// the bare INSERT a round trip as well.
				type run struct {
					way  fenceWay
					rows int
				}
				runs := []run{{check, 1}, {exec, 1}}
				if m.sync && m.spread {
					runs = append(runs, run{record, 1}, run{exec, 5})
				}
				for _, r := range runs {
					name, pool := s.name, db.DB
					switch r.way {
					case exec, record:
						name, pool = s.name+"-"+r.way.String(), execPool(b, db)
						pool.SetMaxOpenConns(conns)
						pool.SetMaxIdleConns(conns)
					}
					rows := ""
					if r.rows > 1 {
						rows = fmt.Sprintf("/rows=%d", r.rows)
					}
					b.Run(fmt.Sprintf("%s/sync=%s/spread=%v%s/conns=%d", name, syncing, m.spread, rows, conns), func(b *testing.B) {
						var unfenced, fenced []func() error
						for range conns {
							unfenced = append(unfenced, holder(pool, bare, r.rows))
							fenced = append(fenced, holder(pool, r.way, r.rows))
						}
						sqltest.InTurns(b, unfenced, fenced)
					})
				}
			}
		}
	}
}

// spreadResources is how many resources a connection of
// BenchmarkFencedWrite's spread mode takes in turn.
const spreadResources = 100

// fenceWay is how a benchmark's write is fenced.
type fenceWay int

const (
	bare   fenceWay = iota // no check
	check                  // Check, then the INSERT
	exec                   // the INSERT with its check (Exec)
	record                 // the INSERT with the fence row's write, unchecked
)

// insertOrders is one INSERT of rows orders of resource with token, and its
// arguments.
func insertOrders(s server, resource string, token int64, rows int) (string, []any) {
	q := "INSERT INTO orders (resource, fence) VALUES "
	var args []any
	for i := range rows {
		if i > 0 {
			q += ", "
		}
		if s.name == "mysql" {
			q += "(?, ?)"
		} else {
			q += fmt.Sprintf("($%d, $%d)", 2*i+1, 2*i+2)
		}
		args = append(args, resource, token)
	}
	return q, args
}

func (w fenceWay) String() string {
	return [...]string{"bare", "check", "exec", "record"}[w]
}

// recordFence is the least a fence kept in the caller's transaction costs:
// the fence row's upsert, without the check's conditions, in the INSERT's
// round trip as Exec sends it (PostgreSQL: a WITH in front of it; MySQL:
// a statement before it in one query). Its $3/$4 (PostgreSQL) are the
// resource and token; MySQL's takes the resource and token first.
func recordFence(s server) string {
	if s.name == "mysql" {
		return "INSERT INTO fences (resource, permit, lock_name, fence) VALUES (?, 0, 'bench', ?) ON DUPLICATE KEY UPDATE fence = VALUES(fence);\n" + insertOrder(s)
	}
	return "WITH f AS (INSERT INTO fences AS f (resource, permit, lock_name, fence) VALUES ($3, 0, 'bench', $4) ON CONFLICT (resource, permit) DO UPDATE SET fence = EXCLUDED.fence)\n" + insertOrder(s)
}

func benchWrite(ctx context.Context, db *sql.DB, s server, tbl *fence.Table, way fenceWay, resource string, token int64, rows int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	switch way {
	case check:
		if err := tbl.Check(ctx, tx, resource, 0, token); err != nil {
			return err
		}
		fallthrough
	case bare:
		q, args := insertOrders(s, resource, token, rows)
		_, err = tx.ExecContext(ctx, q, args...)
	case exec:
		q, args := insertOrders(s, resource, token, rows)
		_, err = tbl.Exec(ctx, tx, resource, 0, token, q, args...)
	case record:
		args := []any{resource, token, resource, token}
		_, err = tx.ExecContext(ctx, recordFence(s), args...)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}
