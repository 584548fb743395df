package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
)

// TestConcurrentHolders: holders, some of them a few fences behind, write orders
// through fenced transactions at once, at every isolation level. Orders get
// their ids while their transaction holds the fence row, so in id order the
// committed orders' fences never go down: no holder wrote after a newer one
// had. The recorded fence is the highest committed one.
func TestConcurrentHolders(t *testing.T) {
	const (
		holders   = 8
		writes    = 15  // per holder
		attempts  = 100 // per write, for serialization failures (PostgreSQL's SERIALIZABLE has many)
		lag       = 3   // how far behind the newest a holder's fence may be
		resources = "lock:order:hot"
	)
	each(t, func(t *testing.T, s server) {
		for _, level := range levels {
			t.Run(level.String(), func(t *testing.T) {
				db, tbl := setup(t, s)
				ctx := testContext(t)
				var wg sync.WaitGroup
				errs := make(chan error, holders)
				var next atomic.Int64
				var mu sync.Mutex
				refused, retried, most := 0, 0, 1
				for h := range holders {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(h), 1))
						for range writes {
							// Fences are issued in order; a holder may be
							// a few behind (its lock has passed on).
							token := max(1, next.Add(1)-rng.Int64N(lag+1))
							err := writeOrder(ctx, db.DB, tbl, s, level, token)
							n := 1
							for ; fence.IsRetryable(err) && n < attempts; n++ {
								err = writeOrder(ctx, db.DB, tbl, s, level, token)
							}
							mu.Lock()
							retried += n - 1
							most = max(most, n)
							mu.Unlock()
							if errors.Is(err, fence.ErrStale) {
								mu.Lock()
								refused++
								mu.Unlock()
								continue
							}
							if err != nil {
								errs <- fmt.Errorf("fence %d after %d attempts: %w", token, n, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				fences := orderFences(t, db.DB, resources)
				for i := 1; i < len(fences); i++ {
					if fences[i] < fences[i-1] {
						t.Fatalf("order %d has fence %d after fence %d was committed: %v", i, fences[i], fences[i-1], fences)
					}
				}
				if len(fences) == 0 || refused == 0 {
					t.Fatalf("%d orders, %d refused: the race did not happen", len(fences), refused)
				}
				wantRecorded(t, db, resources, 0, fences[len(fences)-1], "")
				t.Logf("%d orders committed, %d refused, %d retries (at most %d attempts for one write)", len(fences), refused, retried, most)
			})
		}
	})
}

func writeOrder(ctx context.Context, db *sql.DB, tbl *fence.Table, s server, level sql.IsolationLevel, token int64) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tbl.Check(ctx, tx, "lock:order:hot", 0, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, insertOrder(s), "lock:order:hot", token); err != nil {
		return err
	}
	return tx.Commit()
}

func orderFences(t *testing.T, db *sql.DB, resource string) []int64 {
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
