//go:build !linux

package benchhold

import "time"

const holdMode = "time.Sleep"

func timerSleep(d time.Duration) { time.Sleep(d) }
