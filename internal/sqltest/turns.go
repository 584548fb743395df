package sqltest

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// InTurns is a fenced-write benchmark's loop: b.N writes of each kind,
// unfenced and fenced, taking turns in ten rounds (the first of a round
// alternating) so that other work on the machine weighs on both alike, each
// round's writes spread over the writers, one goroutine each. It reports
// the time per write of each (unfenced-ns, fenced-ns), their ratio over the
// whole run (x-unfenced-total) and the median of the rounds' ratios
// (x-unfenced): a busy moment of the machine weighs on one round's pair,
// not on the median.
func InTurns(b *testing.B, unfenced, fenced []func() error) {
	b.Helper()
	writers := [2][]func() error{unfenced, fenced}
	var spent [2]time.Duration
	const rounds = 10
	ratios := make([]float64, 0, rounds)
	for r := range rounds {
		n := b.N / rounds
		if r < b.N%rounds {
			n++
		}
		var round [2]time.Duration
		for k := range 2 {
			kind := (r + k) % 2
			start := time.Now()
			if err := writeAll(writers[kind], n); err != nil {
				b.Fatal(err)
			}
			round[kind] = time.Since(start)
			spent[kind] += round[kind]
		}
		if n > 0 {
			ratios = append(ratios, float64(round[1])/float64(round[0]))
		}
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "unfenced-ns")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(b.N), "fenced-ns")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "x-unfenced-total")
	if len(ratios) > 0 {
		slices.Sort(ratios)
		h := len(ratios) / 2
		b.ReportMetric((ratios[(len(ratios)-1)/2]+ratios[h])/2, "x-unfenced")
	}
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
