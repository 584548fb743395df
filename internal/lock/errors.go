package lock

import (
	"errors"
	"sync"
)

// ErrNotAcquired means another holder has the lock.
var ErrNotAcquired = errors.New("lock: not acquired: held by another holder")

// ErrLockLost means a lease is no longer held. The concrete error is a
// *LostError that names the key and the reason.
var ErrLockLost = errors.New("lock lost")

// ErrReplicas means WAIT got fewer replica acknowledgements than required.
var ErrReplicas = errors.New("lock: too few replicas acknowledged")

// Reason says why a lease was lost. The values are label values of
// lockstep_lock_lost_total{reason}.
type Reason string

const (
	ReasonStolen      Reason = "stolen"      // the key holds another holder's token
	ReasonExpired     Reason = "expired"     // the key is gone
	ReasonUnreachable Reason = "unreachable" // no renewal succeeded before the local deadline
	ReasonMaxHold     Reason = "max_hold"    // held as long as allowed
	ReasonStalled     Reason = "stalled"     // no progress reported for as long as allowed (watchdog.StallAfter)
	ReasonQuorumLost  Reason = "quorum_lost" // Redlock: fewer than a quorum of nodes kept it
)

// LostError reports a lost lease. errors.Is(err, ErrLockLost) holds for it.
type LostError struct {
	Key    string
	Reason Reason
}

func (e *LostError) Error() string {
	return "lock lost: " + e.Key + ": " + string(e.Reason)
}

// Is makes errors.Is(err, ErrLockLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLockLost }

// errReleased marks a lease its holder released.
var errReleased = errors.New("lock: lease released")

// leaseState is the first terminal state a lease reached; it never changes
// after that, so a late renewal reply cannot revive a lost lease.
type leaseState struct {
	mu  sync.Mutex
	end error
}

func (s *leaseState) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end
}

// set records end unless a terminal state was already recorded, and returns
// the state that holds.
func (s *leaseState) set(end error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.end == nil {
		s.end = end
	}
	return s.end
}
