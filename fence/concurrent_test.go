package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
)

const hotResource = "lock:order:hot"

// TestConcurrentHolders: holders, some of them a few fences behind, write orders
// through fenced transactions at once, at every isolation level. Orders get
// their ids while their transaction holds the fence row, so in id order the
// committed orders' fences never go down: no holder wrote after a newer one
// had. The recorded fence is the highest committed one.
func TestConcurrentHolders(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		for _, level := range levels {
			t.Run(level.String(), func(t *testing.T) {
				db, tbl := setup(t, s)
				ctx := testContext(t)
				race(t, func(token int64) error { return writeOrder(ctx, db.DB, tbl, s, level, token) })
				fences := orderFences(t, db.DB)
				for i := 1; i < len(fences); i++ {
					if fences[i] < fences[i-1] {
						t.Fatalf("order %d has fence %d after fence %d was committed: %v", i, fences[i], fences[i-1], fences)
					}
				}
				if len(fences) == 0 {
					t.Fatal("no order committed")
				}
				wantRecorded(t, db, hotResource, 0, fences[len(fences)-1], "")
			})
		}
	})
}

// TestConcurrentExec: the same race with the check in the write's own
// round trip (Exec), each write an UPDATE that appends its fence to one
// ledger row. On PostgreSQL the UPDATE runs before the check, so the order
// of the ledger row's writes, not of ids, is the order of commits: it holds
// every accepted write's fence once, never going down.
func TestConcurrentExec(t *testing.T) {
	each(t, func(t *testing.T, s server) {
		for _, level := range levels {
			t.Run(level.String(), func(t *testing.T) {
				db, tbl := setup(t, s)
				pool := execPool(t, db)
				ctx := testContext(t)
				appendFence := "UPDATE ledger SET fences = fences || ',' || $1::bigint WHERE resource = $2"
				if s.name == "mysql" {
					appendFence = "UPDATE ledger SET fences = CONCAT(fences, ',', ?) WHERE resource = ?"
				}
				for _, q := range []string{
					"CREATE TABLE ledger (resource varchar(100) PRIMARY KEY, fences text NOT NULL)",
					"INSERT INTO ledger VALUES ('" + hotResource + "', '')",
				} {
					if _, err := db.ExecContext(ctx, q); err != nil {
						t.Fatal(err)
					}
				}
				accepted := race(t, func(token int64) error {
					tx, err := pool.BeginTx(ctx, &sql.TxOptions{Isolation: level})
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if _, err = tbl.Exec(ctx, tx, hotResource, 0, token, appendFence, token, hotResource); err != nil {
						return err
					}
					return tx.Commit()
				})
				var ledger string
				if err := db.QueryRowContext(ctx, "SELECT fences FROM ledger").Scan(&ledger); err != nil {
					t.Fatal(err)
				}
				var fences []int64
				for _, f := range strings.Split(strings.TrimPrefix(ledger, ","), ",") {
					n, err := strconv.ParseInt(f, 10, 64)
					if err != nil {
						t.Fatalf("ledger %q: %v", ledger, err)
					}
					fences = append(fences, n)
				}
				if len(fences) != accepted {
					t.Fatalf("the ledger holds %d writes (%v), %d were accepted", len(fences), fences, accepted)
				}
				for i := 1; i < len(fences); i++ {
					if fences[i] < fences[i-1] {
						t.Fatalf("write %d has fence %d after fence %d was committed: %v", i, fences[i], fences[i-1], fences)
					}
				}
				wantRecorded(t, db, hotResource, 0, fences[len(fences)-1], "")
			})
		}
	})
}

// race runs write from holders at once, each with fences issued in order,
// some a few behind (their lock has passed on); a write that fails
// retryably is run again. It fails the test on any error but a refusal,
// and when no write was refused, and returns how many were accepted.
func race(t *testing.T, write func(token int64) error) (accepted int) {
	t.Helper()
	const (
		holders  = 8
		writes   = 15  // per holder
		attempts = 100 // per write, for serialization failures (PostgreSQL's SERIALIZABLE has many)
		lag      = 3   // how far behind the newest a holder's fence may be
	)
	var wg sync.WaitGroup
	errs := make(chan error, holders)
	var next atomic.Int64
	var mu sync.Mutex
	refused, retried, most := 0, 0, 1
	for h := range holders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(h), 1))
			for range writes {
				token := max(1, next.Add(1)-rng.Int64N(lag+1))
				err := write(token)
				n := 1
				for ; fence.IsRetryable(err) && n < attempts; n++ {
					err = write(token)
				}
				mu.Lock()
				retried += n - 1
				most = max(most, n)
				switch {
				case err == nil:
					accepted++
				case errors.Is(err, fence.ErrStale):
					refused++
				}
				mu.Unlock()
				if err != nil && !errors.Is(err, fence.ErrStale) {
					errs <- fmt.Errorf("fence %d after %d attempts: %w", token, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("%d writes accepted, %d refused: the race did not happen", accepted, refused)
	}
	t.Logf("%d writes accepted, %d refused, %d retries (at most %d attempts for one write)", accepted, refused, retried, most)
	return accepted
}

func writeOrder(ctx context.Context, db *sql.DB, tbl *fence.Table, s server, level sql.IsolationLevel, token int64) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tbl.Check(ctx, tx, hotResource, 0, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, insertOrder(s), hotResource, token); err != nil {
		return err
	}
	return tx.Commit()
}

// orderFences returns the fences of the committed orders, in id order.
func orderFences(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	rows, err := db.QueryContext(testContext(t), "SELECT fence FROM orders ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var f int64
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
