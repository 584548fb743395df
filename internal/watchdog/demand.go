package watchdog

import (
	"context"
	"sync"
	"time"
)

// Defaults of Options.NoticeAfter and Options.NoticeLinger.
const (
	defaultNoticeAfter  = 50 * time.Millisecond
	defaultNoticeLinger = 10 * time.Second
)

// noticeDemand runs the Notifier only while some hold is old enough to need
// it. Server notices are not free: with tracking on, every write to a lock
// key (an acquire, a release) is pushed to every process that listens, which
// for jobs of a millisecond costs 10-20us of Redis CPU each, most of what
// the lock's own scripts cost. A hold that ends within NoticeAfter needs no
// notice: no renewal falls due in that time, and its release checks its
// token anyway. Guarded by the watchdog's mu, but for wg.
type noticeDemand struct {
	n        Notifier
	always   bool               // NoticeAfter < 0
	off      bool               // the Notifier returned on its own: the server cannot send notices
	cancel   context.CancelFunc // of the running Notifier; nil when none runs
	lastLong time.Time          // when a hold at least NoticeAfter old was last seen
	wg       sync.WaitGroup
}

func (d *noticeDemand) wanted() bool  { return d.n != nil && !d.off }
func (d *noticeDemand) running() bool { return d.cancel != nil }

// start runs n until stop; a Notifier that returns before that (the server
// refused notices) is not started again. It calls back under no lock.
func (d *noticeDemand) start(notify func([]string, bool), mu *sync.Mutex) {
	n := d.n
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.wg.Go(func() {
		n.Run(ctx, notify)
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() == nil {
			d.off = true
			d.cancel = nil
		}
		cancel()
	})
}

func (d *noticeDemand) stop() {
	if d.cancel != nil {
		d.cancel()
		d.cancel = nil
	}
}

// wait waits for the Notifier to return, bounded by ctx.
func (d *noticeDemand) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
