package benchhold

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const holdMode = "timerfd"

// timers are timerfds, reused (a hold at a time each).
var timers = sync.Pool{New: func() any {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		panic("benchhold: timerfd_create: " + err.Error())
	}
	// Non-blocking, so os reads it through the poller. Its Fd method would
	// make it blocking: the timer keeps its number itself.
	return &timer{os.NewFile(uintptr(fd), "timerfd"), fd}
}}

type timer struct {
	f  *os.File
	fd int
}

func timerSleep(d time.Duration) {
	if d <= 0 {
		return
	}
	t := timers.Get().(*timer)
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		panic("benchhold: timerfd_settime: " + err.Error())
	}
	var expirations [8]byte
	if _, err := t.f.Read(expirations[:]); err != nil {
		panic("benchhold: timerfd read: " + err.Error())
	}
	timers.Put(t)
}
