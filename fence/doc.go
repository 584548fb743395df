// Package fence checks a lock's fencing token inside the caller's own SQL
// transaction, so that a holder whose lock has passed on cannot write.
//
// A Table keeps, per (resource, permit), the highest fence it accepted and
// the name of the lock that issued it. Check runs in the transaction of the
// business write: it accepts a fence at least the recorded one (equal too: a
// holder writes more than once) and records it, and refuses a lower one with
// a *StaleError that carries the current fence. The write and the fence then
// commit or roll back together:
//
//	fences := fence.Postgres("lockstep_fences")
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	if err := fences.Check(ctx, tx, job.Resource, job.Permit, job.Fence); err != nil {
//		tx.Rollback()
//		return err // errors.Is(err, fence.ErrStale): a newer holder has begun
//	}
//	// the business write, in tx
//	return tx.Commit()
//
// What it guarantees, on PostgreSQL and on MySQL or MariaDB with InnoDB, at
// READ COMMITTED, REPEATABLE READ and SERIALIZABLE:
//   - Check locks the fence row until the transaction ends, so a stale holder
//     and its successor take turns: once a transaction that accepted fence n
//     commits, no transaction accepts a fence below n, and one that rolls back
//     leaves the fence where it was.
//   - The verdict comes from the row judged under that lock, in its latest
//     version, not the REPEATABLE READ snapshot (MySQL: the upsert returns
//     it through LAST_INSERT_ID(expr) in its own answer), never from
//     affected-row counts.
//   - A fence of 0 or less is refused (ErrNoFence): the caller holds no lock.
//   - Fences of two locks are never compared: a check whose lock name (see
//     LockName) differs from the recorded one is refused (ErrOtherLock).
//   - A serialization failure or deadlock is returned as the driver's error,
//     for which IsRetryable reports true: retry the whole transaction. A
//     refusal (stale, other lock, no fence) is never retryable.
//
// What it does not: open or commit a transaction (given a *sql.DB, each
// statement commits on its own, which records a fence but guards no write);
// reset a fence (a lower fence stays refused for good, so a lock's fences
// must never restart; moving a resource to another lock means deleting its
// row while no holder of the old lock can write).
//
// Exec (ExecLease) runs the caller's write with the check in the same round
// trip, so a fenced write takes the bare write's round trips. On PostgreSQL
// the check is a data-modifying WITH in front of the write's statement
// (one INSERT, UPDATE or DELETE) whose refusal fails the statement, the
// write undone, with the current fence in its error; PostgreSQL runs the
// write first and the check at the statement's end, which changes no
// verdict but locks the fence row after the write's rows. On MySQL and
// MariaDB the check and the write go as one multi-statement query, the
// check first, which stops it on a refusal; that needs a transaction and a
// pool with multiStatements and interpolateParams. QueryRow (QueryRowLease)
// is Exec for a PostgreSQL write with RETURNING: its Row's Scan returns the
// row, or the refusal.
//
// A *lockstep.Lease passes itself to CheckLease; a job handler passes
// job.Resource, job.Permit and job.Fence. Package fence/pgxfence does the same
// on pgx's own interface (pgx.Tx) for those who do not use database/sql.
//
// The package imports only database/sql: the driver is the application's.
// Drivers' errors are recognised without importing them (an error with a
// SQLState() method, as pgx's and lib/pq's have; go-sql-driver/mysql's
// *MySQLError by its Number).
package fence
