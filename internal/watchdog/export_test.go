package watchdog

import (
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// SetTestHookRenew installs a function run for each lease as a round is built.
func SetTestHookRenew(w *Watchdog, f func(*lock.Lease)) { w.hooks.renew = f }

// SetDeadline moves a hold's local deadline, as if its last renewal had been
// sent long ago (a process resumed after a pause), without touching timers.
func SetDeadline(h *Hold, d time.Time) { h.setDeadline(d) }

// Lose has the watchdog find h's lease lost for reason, as a renewal would.
func Lose(h *Hold, reason lock.Reason) { h.lose(reason) }
