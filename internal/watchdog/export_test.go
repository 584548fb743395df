package watchdog

import "github.com/lockstep-dev/lockstep/internal/lock"

// SetTestHookRenew installs a function run for each lease as a round is built.
func SetTestHookRenew(w *Watchdog, f func(*lock.Lease)) { w.testHookRenew = f }
