package sqltest

import (
	"sync"
	"testing"
	"time"
)

// InTurns is a fenced-write benchmark's loop: b.N writes of each kind,
// unfenced and fenced, taking turns in ten rounds (the first of a round
// alternating) so that other work on the machine weighs on both alike, each
// round's writes spread over the writers, one goroutine each. It reports
// the time per write of each (unfenced-ns, fenced-ns) and their ratio
// (x-unfenced).
func InTurns(b *testing.B, unfenced, fenced []func() error) {
	b.Helper()
	writers := [2][]func() error{unfenced, fenced}
	var spent [2]time.Duration
	const rounds = 10
	for r := range rounds {
		n := b.N / rounds
		if r < b.N%rounds {
			n++
		}
		for k := range 2 {
			kind := (r + k) % 2
			start := time.Now()
			if err := writeAll(writers[kind], n); err != nil {
				b.Fatal(err)
			}
			spent[kind] += time.Since(start)
		}
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "unfenced-ns")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(b.N), "fenced-ns")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "x-unfenced")
}

// writeAll runs n writes over the writers, one goroutine each, and returns
// the first error.
func writeAll(writers []func() error, n int) error {
	errs := make(chan error, len(writers))
	var wg sync.WaitGroup
	for i, w := range writers {
		share := n / len(writers)
		if i < n%len(writers) {
			share++
		}
		wg.Go(func() {
			for range share {
				if err := w(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
