package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/fence"
)

// BenchmarkFencedWrite is a write transaction (BEGIN, INSERT an order,
// COMMIT) with and without a fence check in it, on the same private server,
// from 1 and 16 connections; each connection writes its own resource with a
// new, higher fence every time (a new holder per write). The fenced run
// reports x-unfenced, its time per write over the unfenced run's just
// before. The test servers run without fsync, so a commit costs less than in
// production and the ratio is an upper bound.
//
//	go test -run '^$' -bench FencedWrite -benchtime 2s ./fence
func BenchmarkFencedWrite(b *testing.B) {
	for _, s := range servers {
		for _, conns := range []int{1, 16} {
			db := s.open(b)
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
			var unfenced float64 // ns per write
			for _, fenced := range []bool{false, true} {
				name := fmt.Sprintf("%s/conns=%d/fenced=%v", s.name, conns, fenced)
				// Across the runs of b.N: each goroutine's own resource, and
				// fences that only grow.
				var next, tokens atomic.Int64
				b.Run(name, func(b *testing.B) {
					var check *fence.Table
					if fenced {
						check = tbl
					}
					start := time.Now()
					if conns == 1 {
						resource := fmt.Sprintf("r%d-%v", next.Add(1), fenced)
						for range b.N {
							if err := benchWrite(ctx, db.DB, s, check, resource, tokens.Add(1)); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						b.SetParallelism((conns + 1) / 2) // GOMAXPROCS (2 here) × this goroutines
						b.RunParallel(func(pb *testing.PB) {
							resource := fmt.Sprintf("r%d-%v", next.Add(1), fenced)
							for pb.Next() {
								if err := benchWrite(ctx, db.DB, s, check, resource, tokens.Add(1)); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					perWrite := float64(time.Since(start).Nanoseconds()) / float64(b.N)
					if !fenced {
						unfenced = perWrite
					} else if unfenced > 0 {
						b.ReportMetric(perWrite/unfenced, "x-unfenced")
					}
				})
			}
		}
	}
}

func benchWrite(ctx context.Context, db *sql.DB, s server, check *fence.Table, resource string, token int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if check != nil {
		if err := check.Check(ctx, tx, resource, 0, token); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, insertOrder(s), resource, token); err != nil {
		return err
	}
	return tx.Commit()
}
