package pgxfence_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lockstep-dev/lockstep/fence"
	"github.com/lockstep-dev/lockstep/fence/pgxfence"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// BenchmarkQueuedWrite is fence's BenchmarkFencedWrite on pgx with the check
// queued in the write's batch (Queue): BEGIN, one batch of the check and an
// INSERT, COMMIT, beside the same transaction without the check (BEGIN,
// INSERT, COMMIT), on the same private server, from 1 and 16 connections,
// each connection's holders taking 100 resources in turn with rising
// fences. The two take turns in 10 rounds; an op is one write of each. It
// reports the time per write of each and their ratio (x-unfenced: the
// median of the rounds'; x-unfenced-total: over the run). sync=on
// is a server that writes each commit to disk before it answers, as
// production servers do.
//
//	go test -run '^$' -bench QueuedWrite -benchtime 2s ./fence/pgxfence
func BenchmarkQueuedWrite(b *testing.B) {
	for _, syncing := range []bool{true, false} {
		for _, conns := range []int{1, 16} {
			db := sqltest.Postgres(b)
			if syncing {
				db = sqltest.PostgresSync(b)
			}
			ctx := context.Background()
			tbl := fence.Postgres("fences")
			setup := connect(b, db)
			if err := pgxfence.Create(ctx, setup, tbl); err != nil {
				b.Fatal(err)
			}
			if _, err := setup.Exec(ctx, "CREATE TABLE orders (id bigserial PRIMARY KEY, resource text NOT NULL, fence bigint NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			var next, tokens atomic.Int64
			// writer is one connection's writes, fenced or not: each call the
			// next holder on the connection's next resource.
			writer := func(c *pgx.Conn, fenced bool) func() error {
				base, i := next.Add(1), 0
				return func() error {
					resource := fmt.Sprintf("r%d-%d", base, i%100)
					i++
					token := tokens.Add(1)
					tx, err := c.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					batch := &pgx.Batch{}
					var verdict *pgxfence.Pending
					if fenced {
						verdict = pgxfence.Queue(batch, tbl, resource, 0, token)
					}
					batch.Queue("INSERT INTO orders (resource, fence) VALUES ($1, $2)", resource, token)
					if err := tx.SendBatch(ctx, batch).Close(); err != nil {
						return err
					}
					if fenced {
						if err := verdict.Err(ctx, tx); err != nil {
							return err
						}
					}
					return tx.Commit(ctx)
				}
			}
			b.Run(fmt.Sprintf("sync=%v/conns=%d", map[bool]string{true: "on", false: "off"}[syncing], conns), func(b *testing.B) {
				var unfenced, fenced []func() error
				for range conns { // a connection each, for both in turn
					c := connect(b, db)
					unfenced, fenced = append(unfenced, writer(c, false)), append(fenced, writer(c, true))
				}
				sqltest.InTurns(b, unfenced, fenced)
			})
		}
	}
}
