// Package locklink lets a back end that the root package does not link
// (etcd, in the public package etcd) build a *lockstep.Locker: the root
// package sets New when it is initialised, so the root package never imports
// that back end's client.
package locklink

import "github.com/lockstep-dev/lockstep/internal/lock"

// New builds a *lockstep.Locker (returned as any) over the Locker that build
// returns for the lock options of opts (a []lockstep.Option, as any); the
// Locker's Close also closes that Locker. The root package sets it.
var New func(build func([]lock.Option) *lock.Locker, opts any) any
