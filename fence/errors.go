package fence

import (
	"errors"
	"fmt"
	"reflect"
)

// ErrStale is the sentinel of StaleError: errors.Is(err, ErrStale) holds when
// a check was refused because a higher fence had been accepted.
var ErrStale = errors.New("fence: stale fence")

// StaleError refuses a fence lower than the one accepted for the resource's
// permit: a newer holder has begun, and this one must not write.
type StaleError struct {
	Resource string
	Permit   int
	Token    int64 // the fence presented
	Current  int64 // the fence accepted before, higher than Token
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale fence %d for %q permit %d: fence %d was accepted", e.Token, e.Resource, e.Permit, e.Current)
}

// Is makes errors.Is(err, ErrStale) hold.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// ErrOtherLock is the sentinel of OtherLockError.
var ErrOtherLock = errors.New("fence: fence of another lock")

// OtherLockError refuses a check whose lock name differs from the one the
// resource's fence was recorded under: the two locks' fences count
// separately, so comparing them would mean nothing. Moving a resource to
// another lock needs its fence row deleted while no holder of the old lock
// can write.
type OtherLockError struct {
	Resource string
	Permit   int
	Lock     string // the lock name of the check
	Recorded string // the lock name the fence was recorded under
}

func (e *OtherLockError) Error() string {
	return fmt.Sprintf("fence: %q permit %d is fenced by lock %q, not %q: fences of two locks are not comparable",
		e.Resource, e.Permit, e.Recorded, e.Lock)
}

// Is makes errors.Is(err, ErrOtherLock) hold.
func (e *OtherLockError) Is(target error) bool { return target == ErrOtherLock }

// ErrNoFence is returned (wrapped) for a fence of 0 or less: the caller
// holds no lock (a job without one has Fence 0).
var ErrNoFence = errors.New("fence: no fence (0 or less): the caller holds no lock")

type noFenceError struct {
	resource string
	permit   int
	token    int64
}

func (e *noFenceError) Error() string {
	return fmt.Sprintf("fence: %q permit %d: fence %d refused: a caller without a lock has no fence", e.resource, e.permit, e.token)
}

func (e *noFenceError) Is(target error) bool { return target == ErrNoFence }

// IsRetryable reports whether err says the transaction lost a race the
// server would not serialize and should be run again from its start: a
// serialization failure or deadlock (PostgreSQL 40001, 40P01; MySQL and
// MariaDB 1213 deadlock, 1205 lock wait timeout, 1020 record changed since
// read under innodb_snapshot_isolation). A refusal of this package (stale,
// other lock, no fence) is never retryable: a retry would be refused again.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrStale) || errors.Is(err, ErrOtherLock) || errors.Is(err, ErrNoFence) {
		return false
	}
	return walk(err, func(e error) bool {
		if s, ok := e.(interface{ SQLState() string }); ok { // pgx's *pgconn.PgError, lib/pq's *pq.Error
			switch s.SQLState() {
			case "40001", "40P01":
				return true
			}
			return false
		}
		if n, ok := mysqlNumber(e); ok {
			switch n {
			case 1213, 1205, 1020:
				return true
			}
		}
		return false
	})
}

// walk reports whether f holds for err or any error it wraps.
func walk(err error, f func(error) bool) bool {
	for depth := 0; err != nil && depth < 100; depth++ {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walk(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// mysqlNumber returns the error number of go-sql-driver/mysql's
// *MySQLError{Number uint16, ...}, which has no method that gives it: it is
// read by reflection so that this package need not import the driver.
func mysqlNumber(err error) (uint16, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return 0, false
	}
	v = v.Elem()
	if v.Kind() != reflect.Struct || v.Type().Name() != "MySQLError" {
		return 0, false
	}
	n := v.FieldByName("Number")
	if !n.IsValid() || n.Kind() != reflect.Uint16 {
		return 0, false
	}
	return uint16(n.Uint()), true
}
