package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// clockStep is how often the embedded Redis's TTLs are moved on.
const clockStep = 25 * time.Millisecond

// embedded is an in-memory Redis (miniredis) on a free loopback port.
//
// miniredis reads the wall clock for TIME, stream ids and EXPIREAT, but counts
// TTLs (PX, PEXPIRE) down only when told to: left alone, no lock would ever
// expire. A goroutine moves every TTL on by the real (monotonic) time elapsed,
// every clockStep. A key set just after a step is charged that whole step, so
// a key expires up to clockStep earlier than on a real Redis (or later, by
// the goroutine's scheduling delay). The watchdog's drift margin covers that
// as long as it exceeds clockStep: the default ttl/10 does for every ttl of
// 250ms or more, and the local run's 2s ttl has 200ms.
//
// miniredis's ClockTTL would be exact, but it walks and sorts every key on
// every command; a step walks them once (about 0.2ms per 1,000 keys).
type embedded struct {
	m    *miniredis.Miniredis
	stop chan struct{}
	done sync.WaitGroup
}

func startEmbedded() (*embedded, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	e := &embedded{m: m, stop: make(chan struct{})}
	e.done.Go(e.advance)
	return e, nil
}

// advance moves TTLs on in step with real time.
func (e *embedded) advance() {
	t := time.NewTicker(clockStep)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			now := time.Now()
			e.m.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Addr is the server's host:port.
func (e *embedded) Addr() string { return e.m.Addr() }

// Close stops the clock and the server.
func (e *embedded) Close() {
	close(e.stop)
	e.done.Wait()
	e.m.Close()
}
