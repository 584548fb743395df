package jobs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// BenchmarkMemoryHandOff serves b.N hand-off jobs, memJobsPerResource
// consecutive jobs on each resource (so that all but the first of each
// arrive while the lock is held: they park in the resource's queue and run
// handed on, in a chain), through the lock middleware on one private Redis,
// and the same b.N tasks on plain asynq with no lock on another, in the same
// run; once without a retention and once with asynq.Retention(1h).
//
// The comparison is what an operator pays: Lockstep's memory is the
// difference between the two servers' used_memory (and key counts) at the
// same point of the same work, so that it includes what Lockstep makes
// asynq keep (a parked task sits in the retry set with its contention
// error) as well as its own keys; asynq's own memory is the plain server's.
// The points are the peak (sampled every 100 ms, all tasks enqueued up
// front), the end (asynq has recorded every task), and once Lockstep's
// bounds have passed (its keys back to the few of a running server, at most
// the done markers' bound). x-asynq is the largest difference per job over
// the largest of asynq's own per job: the ≤ 20% target.
//
//	go test -run '^$' -bench MemoryHandOff -benchtime 200000x -timeout 30m ./internal/jobs
func BenchmarkMemoryHandOff(b *testing.B) {
	for _, retention := range []time.Duration{0, time.Hour} {
		name := "no-retention"
		if retention > 0 {
			name = "retention-" + retention.String()
		}
		b.Run(name, func(b *testing.B) { benchMemoryHandOff(b, retention) })
	}
}

// memJobsPerResource is how many consecutive jobs share one resource, and
// memWork how long each runs: long enough that the next ones of its
// resource arrive while it holds the lock.
const (
	memJobsPerResource = 100
	memWork            = 500 * time.Microsecond
)

func benchMemoryHandOff(b *testing.B, retention time.Duration) {
	cfg := Config{Concurrency: 10, Backoff: backoff.Requeue, LockTTL: 5 * time.Second}
	n := b.N
	locked, plain := newBenchRig(b), newBenchRig(b)
	opts := []asynq.Option{asynq.MaxRetry(3)}
	if retention > 0 {
		opts = append(opts, asynq.Retention(retention))
	}
	var parked atomic.Int64
	b.ResetTimer()
	run := func(r *benchRig, lockstep bool) memRun {
		var m memRun
		m.empty = r.mem(b)
		began := time.Now()
		r.enqueueInOrder(b, n, opts)
		m.enqueue = time.Since(began)
		m.enqueued = r.mem(b)
		began = time.Now()
		c := newCounter(n)
		peak := r.samplePeak()
		var stop func()
		if lockstep {
			stop = r.serveLocked(b, cfg, Spec{
				Type:     "bench:mem",
				Decode:   func(p []byte) (any, error) { return string(p), nil },
				Resource: func(p any) string { return p.(string) },
				Run:      func(context.Context, Job, any) error { time.Sleep(memWork); c.add(); return nil },
			})
			r.srv.hooks.wait = func(Job, float64) { parked.Add(1) }
		} else {
			stop = r.servePlain(b, cfg, func(context.Context, *asynq.Task) error { time.Sleep(memWork); c.add(); return nil })
		}
		waitDone(b, c.done, 30*time.Minute)
		r.waitRecorded(b, retention > 0, n)
		m.serve = time.Since(began)
		m.end = r.mem(b)
		m.peak = peak()
		m.peak.used = max(m.peak.used, m.enqueued.used, m.end.used)
		if lockstep {
			// Lockstep's bounds: done markers dropped a beat after their
			// task completed, fencing counters the lock's TTL + fence_ttl
			// after their last use; a running server keeps its beat.
			deadline := time.Now().Add(cfg.LockTTL + 2*time.Minute)
			for r.lockstepKeys(b) > 3 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			m.lockstepKeysEnd = r.lockstepKeys(b)
			m.settled = r.mem(b)
		}
		stop()
		return m
	}
	p := run(plain, false)
	l := run(locked, true)
	b.StopTimer()

	per := func(v int64) float64 { return float64(v) / float64(n) }
	own := max(p.peak.used, p.end.used) - p.empty.used // asynq's own, at its largest
	extraPeak := (l.peak.used - l.empty.used) - (p.peak.used - p.empty.used)
	extraEnd := (l.end.used - l.empty.used) - (p.end.used - p.empty.used)
	extraSettled := (l.settled.used - l.empty.used) - (p.end.used - p.empty.used)
	b.ReportMetric(per(p.enqueued.used-p.empty.used), "asynq-pending-B/job")
	b.ReportMetric(per(p.peak.used-p.empty.used), "asynq-peak-B/job")
	b.ReportMetric(per(p.end.used-p.empty.used), "asynq-end-B/job")
	b.ReportMetric(per(p.end.keys-p.empty.keys), "asynq-end-keys/job")
	b.ReportMetric(per(extraPeak), "lockstep-peak-B/job")
	b.ReportMetric(per(extraEnd), "lockstep-end-B/job")
	b.ReportMetric(per((l.end.keys-l.empty.keys)-(p.end.keys-p.empty.keys)), "lockstep-end-keys/job")
	b.ReportMetric(per(extraSettled), "lockstep-settled-B/job")
	b.ReportMetric(float64(l.lockstepKeysEnd), "lockstep-keys-settled")
	b.ReportMetric(float64(max(extraPeak, extraEnd))/float64(own), "x-asynq")
	b.ReportMetric(float64(parked.Load())/float64(n), "parked/job")
	b.ReportMetric(float64(n)/l.serve.Seconds(), "lockstep-jobs/s")
	b.ReportMetric(float64(n)/p.serve.Seconds(), "asynq-jobs/s")
	b.ReportMetric(float64(2*n)/(l.enqueue+p.enqueue).Seconds(), "enqueued/s")
}

// memPoint is Redis's used_memory and key count at one moment.
type memPoint struct{ used, keys int64 }

// memRun is one server's points.
type memRun struct {
	empty, enqueued, peak, end, settled memPoint
	lockstepKeysEnd                     int64
	enqueue, serve                      time.Duration
}

func (r *benchRig) mem(b *testing.B) memPoint {
	return memPoint{used: int64(r.info(b, "memory", "used_memory")), keys: r.admin.DBSize(context.Background()).Val()}
}

// samplePeak samples used_memory every 100 ms until the returned function
// is called, which returns the largest.
func (r *benchRig) samplePeak() func() memPoint {
	var peak atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				s, err := r.admin.Info(context.Background(), "memory").Result()
				if err != nil {
					continue
				}
				for _, line := range strings.Split(s, "\r\n") {
					if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
						u, _ := strconv.ParseInt(v, 10, 64)
						if u > peak.Load() {
							peak.Store(u)
						}
					}
				}
			}
		}
	})
	return func() memPoint { close(quit); wg.Wait(); return memPoint{used: peak.Load()} }
}

// enqueueInOrder enqueues n tasks of bench:mem, memJobsPerResource
// consecutive ones per resource, in that order (asynq's pending list is
// FIFO): a few enqueuers, each taking whole resources in turn.
func (r *benchRig) enqueueInOrder(b *testing.B, n int, opts []asynq.Option) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range cap(errs) {
		wg.Go(func() {
			for {
				res := int(next.Add(1) - 1)
				first := res * memJobsPerResource
				if first >= n {
					return
				}
				payload := []byte("mem:" + strconv.Itoa(res))
				for i := first; i < min(first+memJobsPerResource, n); i++ {
					if _, err := r.enq.Enqueue(asynq.NewTask("bench:mem", payload), opts...); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// waitRecorded waits until asynq has recorded every task of the default
// queue: none pending, active, scheduled or in the retry set (and, with a
// retention, n completed).
func (r *benchRig) waitRecorded(b *testing.B, kept bool, n int) {
	insp := asynq.NewInspectorFromRedisClient(r.admin)
	redistest.WaitEvery(b, 2*time.Minute, 100*time.Millisecond, "asynq to record every task", func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Pending+q.Active+q.Scheduled+q.Retry+q.Aggregating == 0 && (!kept || q.Completed == n)
	})
}

// lockstepKeys counts the keys under lockstep: (SCAN).
func (r *benchRig) lockstepKeys(b *testing.B) int64 {
	var n int64
	iter := r.admin.Scan(context.Background(), 0, "lockstep:*", 10000).Iterator()
	for iter.Next(context.Background()) {
		n++
	}
	if err := iter.Err(); err != nil {
		b.Fatal(fmt.Errorf("SCAN: %w", err))
	}
	return n
}

// BenchmarkMemoryParked parks b.N jobs on one resource whose lock the
// benchmark holds, through the lock middleware, and compares Redis's memory
// once all of them wait (asynq's retry set, with their contention error,
// and the resource's queue) with the same b.N tasks pending on plain asynq:
// what a job costs while it waits for a hand-off, the most it costs.
// lockstep-queue-B/job is the queue's own share (MEMORY USAGE), the rest is
// what parking makes asynq keep.
//
//	go test -run '^$' -bench MemoryParked -benchtime 100000x ./internal/jobs
func BenchmarkMemoryParked(b *testing.B) {
	cfg := Config{Concurrency: 10, Backoff: backoff.Requeue, LockTTL: 5 * time.Second}
	ctx := context.Background()
	n := b.N
	locked, plain := newBenchRig(b), newBenchRig(b)
	opts := []asynq.Option{asynq.MaxRetry(3)}
	b.ResetTimer()
	p0 := plain.mem(b)
	plain.enqueueOne(b, n, opts)
	p1 := plain.mem(b)

	l0 := locked.mem(b)
	holder := lock.New(locked.admin)
	if _, err := holder.TryAcquire(ctx, "mem:hot", 10*time.Minute); err != nil {
		b.Fatal(err)
	}
	locked.enqueueOne(b, n, opts)
	stop := locked.serveLocked(b, cfg, Spec{
		Type:     "bench:mem",
		Decode:   func(p []byte) (any, error) { return string(p), nil },
		Resource: func(p any) string { return p.(string) },
		Run:      func(context.Context, Job, any) error { return nil },
	})
	insp := asynq.NewInspectorFromRedisClient(locked.admin)
	queue := "lockstep:{mem:hot}:queue"
	redistest.WaitEvery(b, 10*time.Minute, 100*time.Millisecond, fmt.Sprintf("all %d parked", n), func() bool {
		q, err := insp.GetQueueInfo("default")
		return err == nil && q.Retry == n && locked.admin.ZCard(ctx, queue).Val() == int64(n)
	})
	stop()
	l1 := locked.mem(b)
	b.StopTimer()
	own := float64(p1.used-p0.used) / float64(n)
	extra := float64((l1.used-l0.used)-(p1.used-p0.used)) / float64(n)
	q := float64(locked.admin.MemoryUsage(ctx, queue, 0).Val()) / float64(n)
	b.ReportMetric(own, "asynq-pending-B/job")
	b.ReportMetric(extra, "lockstep-parked-B/job")
	b.ReportMetric(q, "lockstep-queue-B/job")
	b.ReportMetric(extra/own, "x-asynq")
}

// enqueueOne enqueues n tasks of bench:mem on the one resource mem:hot.
func (r *benchRig) enqueueOne(b *testing.B, n int, opts []asynq.Option) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range cap(errs) {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := r.enq.Enqueue(asynq.NewTask("bench:mem", []byte("mem:hot")), opts...); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
