package pgxfence_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// reports the time per write of each and their ratio (x-unfenced). sync=on
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
				var writers [2][]func() error // unfenced, fenced
				for range conns { // a connection each, for both in turn
					c := connect(b, db)
					writers[0] = append(writers[0], writer(c, false))
					writers[1] = append(writers[1], writer(c, true))
				}
				var spent [2]time.Duration
				const rounds = 10
				for r := range rounds {
					n := b.N / rounds
					if r < b.N%rounds {
						n++
					}
					for k := range 2 {
						fenced := (r + k) % 2 // the first of a round alternates
						start := time.Now()
						if err := writeAll(writers[fenced], n); err != nil {
							b.Fatal(err)
						}
						spent[fenced] += time.Since(start)
					}
				}
				b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "unfenced-ns")
				b.ReportMetric(float64(spent[1].Nanoseconds())/float64(b.N), "fenced-ns")
				b.ReportMetric(float64(spent[1])/float64(spent[0]), "x-unfenced")
			})
		}
	}
}

// writeAll runs n writes over the writers, one goroutine each, and returns
// the first error.
func writeAll(writers []func() error, n int) error {
	errs := make(chan error, len(writers))
	var wg sync.WaitGroup
	for i, w := range writers {
		share := n / len(writers)
		if i < n%len(writers) {
			share++
		}
		wg.Go(func() {
			for range share {
				if err := w(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
