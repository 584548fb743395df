// Package procid names a process the one way Lockstep's records do:
// host:pid. Lock tokens (the holder `lockstep locks` shows), the demo's
// worker field, the chaos history and scheduler replica ids all use it.
package procid

import (
	"os"
	"strconv"
)

// host is this machine's name, "unknown" when the system does not say.
var host = func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}()

// self is this process's name, built once.
var self = Of(os.Getpid())

// Self returns this process's name: host:pid.
func Self() string { return self }

// Of returns the name of process pid on this host: host:pid.
func Of(pid int) string { return host + ":" + strconv.Itoa(pid) }
