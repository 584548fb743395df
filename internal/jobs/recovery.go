package jobs

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Recovery of a dead worker's locked jobs, driven by their locks (see
// internal/lock/tasks.go). Every job server
//
//   - records each task it takes a lock for in its process's holds set (the
//     take and the hand-off do it in the same script), and removes the
//     record a whole beat after the task left its hands;
//   - beats: its entry in the processes zset says until when it is alive
//     (three beats ahead);
//   - looks, every recoverPoll, for processes whose beat is overdue (once
//     its own beats have landed for longer than a beat's deadline: see
//     judging), and for
//     each hold record of such a process whose lock that process no longer
//     holds (it expired: the holder is gone; a live holder is cancelled
//     before its lease can expire, G4), brings the task back at once to the
//     head of its queue (asynqstore.Recover). Exactly one recoverer wins a
//     record (SREM).
//
// A recovered task takes its lock like any delivery: a waiter that was
// handed the lock meanwhile runs first, and the recovered task joins the
// end of the queue. A task that had already run (its handler returned, but
// asynq never heard) finds its done marker and completes unrun (G8): every
// release leaves one for recoveryTTL. Recovery costs no Redis work per held
// lock: one beat per process, one look per poll, and the records' adds and
// removes, once per job.

// recoverPoll is how often a job server looks for dead processes.
const recoverPoll = 500 * time.Millisecond

// beatInterval is how often a job server beats: a third of the lock TTL, at
// most a second.
func (s *Server) beatInterval() time.Duration { return min(s.cfg.LockTTL/3, time.Second) }

// recoveryTTL is how long a finished task's done marker outlives its
// release for a recoverer: past the beats a dead process misses before it
// counts as dead, and two looks.
func (s *Server) recoveryTTL() time.Duration {
	return 4*s.beatInterval() + 2*recoverPoll + 2*time.Second
}

// recovery is a job server's part in recovery.
type recovery struct {
	reg *lock.Registry // this process's (host:pid) records, beats and markers

	mu sync.Mutex
	// Records of the tasks that left, to remove: those queued before the
	// last beat (aged) at the next beat, the others (done) at the one after.
	// A record outlives its task's leaving by a whole beat, so that asynq
	// has recorded the task's result first.
	done, aged map[string]struct{}
	// kept: records and markers of tasks that left but that asynq still
	// holds, since when; see settled.
	kept map[string]time.Time
	// leftAt: when each record's task left this process's hands (left), to
	// tell asynq's later deliveries of it from this one (settled).
	leftAt map[string]time.Time
	// markers: done markers to delete at the next beat, with their tasks
	markers map[string]asynqstore.Task
	landed  time.Time // when the first of the beats that have all landed since was sent; zero after a failed one

	// dequeues says that asynq's every dequeue records its task's bare
	// record (asynqstore.RecordDequeues), for a task id it can record.
	dequeues bool
}

func newRecovery(reg *lock.Registry) *recovery {
	return &recovery{reg: reg, done: map[string]struct{}{}, aged: map[string]struct{}{},
		kept: map[string]time.Time{}, leftAt: map[string]time.Time{}, markers: map[string]asynqstore.Task{}}
}

// left queues the hold record of a task that left this process's hands (it
// returned to asynq, or a chain completed it) for removal a whole beat
// later, once asynq has recorded it.
func (r *recovery) left(resource, queue, id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	rec := lock.HoldRecord(resource, queue, id)
	r.done[rec] = struct{}{}
	r.leftAt[rec] = time.Now()
	r.mu.Unlock()
}

// back cancels the removal queued for the record of the task id of queue
// on resource ("": its bare record): the task is in this process's hands
// again, recorded anew (by asynq's dequeue, or a hand-off).
func (r *recovery) back(resource, queue, id string) {
	if r == nil {
		return
	}
	rec := lock.HoldRecord(resource, queue, id)
	r.mu.Lock()
	delete(r.done, rec)
	delete(r.aged, rec)
	delete(r.kept, rec)
	delete(r.leftAt, rec)
	r.mu.Unlock()
}

// forget queues the done marker of the task id of queue for deletion at
// the next beat at which asynq can no longer deliver the task (settled):
// its task left this process's hands.
func (r *recovery) forget(marker, queue, id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.markers[marker] = asynqstore.Task{Queue: queue, ID: id}
	r.mu.Unlock()
}

// holdsFor is where a task run under ctx records its holds: this process's
// holds set, except for a schedule's run under an overlap policy
// (processRun). Such a run ends when its worker dies (its run lock expires)
// and the schedule's next tick runs; a recovered run would run beside the
// runs the policy let in meanwhile.
func (s *Server) holdsFor(ctx context.Context) string {
	if s.recovery == nil || ctx.Value(inRunKey{}) != nil {
		return ""
	}
	return s.recovery.reg.Holds()
}

// holdBare records, for a recoverer, a task this process holds without a
// lock (its handler takes none, or it waits in the worker for one): its
// bare record, a hold record without a resource, unless asynq's dequeue
// wrote it already. A dead process's bare records are brought back as soon
// as it is judged dead, while the task is still active. It reports whether
// it wrote the record; the caller then has it removed once the task leaves
// (recovery.left with no resource). A task that gets its lock has its bare
// record replaced by its hold record (swapBare, take.lua).
func (s *Server) holdBare(ctx context.Context, job Job) bool {
	holds := s.holdsFor(ctx)
	if holds == "" || s.recovery.dequeues && asynqstore.Recorded(job.ID) {
		return false
	}
	if err := s.recovery.reg.Record(ctx, lock.HoldRecord("", job.Queue, job.ID)); err != nil {
		s.log.Warn("recording a task failed; a crash of this worker leaves it to asynq's lease recovery", "id", job.ID, "err", err)
		return false
	}
	return true
}

// swapBare replaces job's bare record (if any) with its hold record on
// resource, in one step (a recoverer sees one or the other), once it holds
// the lock. (take.lua does the same for a lock it takes.)
func (s *Server) swapBare(ctx context.Context, job Job, resource string) {
	if s.holdsFor(ctx) == "" {
		return
	}
	if err := s.recovery.reg.Swap(ctx, lock.HoldRecord("", job.Queue, job.ID), lock.HoldRecord(resource, job.Queue, job.ID)); err != nil {
		s.log.Warn("recording a hold failed; a crash of this worker leaves the task to asynq's lease recovery", "id", job.ID, "err", err)
	}
}

// dropBare removes now the bare record asynq's dequeue wrote for a task
// that is not recovered from here on: a schedule's run under an overlap
// policy once it has its run lock (holdsFor).
func (s *Server) dropBare(ctx context.Context, job Job) {
	_ = s.recovery.reg.Drop(context.WithoutCancel(ctx), lock.HoldRecord("", job.Queue, job.ID))
}

// Recovery on the back ends without the hand-off (Redlock, etcd,
// wait_replicas): the locks live elsewhere, so the hold record and the done
// marker are written beside the queue, in their own commands: the record
// once the lock is taken, the marker before the lock is released.

// ranBefore reports the outcome of an earlier run of job that a dead worker
// had finished (its done marker), read beside the queue.
func (s *Server) ranBefore(ctx context.Context, job Job) (string, bool) {
	if s.holdsFor(ctx) == "" {
		return "", false
	}
	v, err := s.recovery.reg.Outcome(ctx, job.Resource, job.Queue, job.ID)
	return v, err == nil && v == outcomeOK
}

// runRecoverable runs job under lease (taken through the Locker) with its
// hold recorded for recovery.
func (s *Server) runRecoverable(ctx context.Context, spec *Spec, job Job, payload any, lease *lock.Lease) error {
	if s.holdsFor(ctx) == "" {
		return s.run(ctx, spec, job, payload, lease, nil)
	}
	s.swapBare(ctx, job, job.Resource)
	defer s.recovery.left(job.Resource, job.Queue, job.ID)
	marker := s.locker.DoneKey(job.Resource, job.Queue, job.ID)
	h := &handoff{release: func(ctx context.Context, outcome string) error {
		if outcome == outcomeOK {
			if err := s.recovery.reg.MarkDone(ctx, job.Resource, job.Queue, job.ID, outcomeOK, s.recoveryTTL()); err != nil {
				s.log.Debug("done marker for recovery not written", "id", job.ID, "err", err)
			}
			s.recovery.forget(marker, job.Queue, job.ID)
		}
		return lease.Release(ctx)
	}}
	return s.run(ctx, spec, job, payload, lease, h)
}

// runRecovery beats and recovers until ctx ends. The beats have a goroutine
// of their own: a look at a dead process can wait on a master that is
// paused or failing over (its records, its locks) for seconds, and a live
// process must not miss its beats meanwhile.
func (s *Server) runRecovery(ctx context.Context) {
	var beats sync.WaitGroup
	defer beats.Wait()
	beats.Go(func() {
		beat := time.NewTicker(s.beatInterval())
		defer beat.Stop()
		for s.beat(ctx); ; s.beat(ctx) {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
			}
		}
	})
	look := time.NewTimer(recoverPoll)
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-look.C:
			s.recoverDead(ctx)
			look.Reset(recoverPoll/2 + rand.N(recoverPoll)) // the processes' looks spread out
		}
	}
}

// beat says this process is alive for three more beats, and removes the
// hold records of the tasks that left before the last beat.
//
// The beat itself is a command of its own, sent first: what follows it
// (asynq's states of the tasks that left, the records and done markers to
// remove) lies on a Cluster in other slots than the processes zset, on
// masters that may be paused or failing over, and a live process must not
// look dead to the others, who would bring back a task whose handler had
// returned, for them.
func (s *Server) beat(ctx context.Context) {
	r := s.recovery
	ctx, cancel := context.WithTimeout(ctx, s.beatInterval())
	defer cancel()
	sent := time.Now()
	beatErr := r.reg.Beat(ctx, sent.Add(3*s.beatInterval()))
	r.mu.Lock()
	aged, markers := r.aged, r.markers
	r.aged, r.done, r.markers = r.done, map[string]struct{}{}, map[string]asynqstore.Task{}
	if beatErr != nil {
		r.landed = time.Time{}
	} else if r.landed.IsZero() {
		r.landed = sent
	}
	r.mu.Unlock()
	if beatErr != nil {
		s.log.Debug("recovery beat failed", "err", beatErr)
	}
	keep := s.settled(ctx, aged, markers)
	done := make([]string, 0, len(aged))
	for rec := range aged {
		if !keep[rec] {
			done = append(done, rec)
		}
	}
	var drop []string
	for m := range markers {
		if !keep[m] {
			drop = append(drop, m)
		}
	}
	err := r.reg.Remove(ctx, done, drop)
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range keep {
		if t, ok := markers[k]; ok {
			r.markers[k] = t
		} else if _, ok := r.kept[k]; ok { // not back in this process's hands meanwhile
			r.aged[k] = struct{}{}
		}
	}
	if err != nil {
		s.log.Debug("recovery: removing the records of tasks that left failed", "err", err)
		for rec := range aged {
			r.aged[rec] = struct{}{}
		}
		for m, t := range markers {
			r.markers[m] = t
		}
	}
}

// settled returns the hold records of aged and the done markers to keep
// for now. A record stays while asynq still has its task active: the
// handler returned, but asynq has not recorded the result yet (it retries
// that every few seconds while Redis was away), and a worker killed
// meanwhile would leave the task to asynq's own lease (half a minute and
// more) if its record were gone. A marker stays while asynq may still
// deliver its task: a worker frozen past its lease that resumes has asynq
// retry the task it ran (asynq does not check whose delivery it ends), and
// that delivery must read the marker and not run the task again. Either
// is kept so for at most asynqstore.Redelivery, the bound of asynq's own
// lease; a marker's own TTL is longer.
func (s *Server) settled(ctx context.Context, aged map[string]struct{}, markers map[string]asynqstore.Task) map[string]bool {
	if len(aged)+len(markers) == 0 || s.store == nil {
		return nil
	}
	keys := make([]string, 0, len(aged)+len(markers))
	tasks := make([]asynqstore.Task, 0, len(aged)+len(markers))
	for rec := range aged {
		if _, queue, id, ok := lock.ParseHoldRecord(rec); ok {
			keys, tasks = append(keys, rec), append(tasks, asynqstore.Task{Queue: queue, ID: id})
		}
	}
	records := len(keys)
	for m, t := range markers {
		keys, tasks = append(keys, m), append(tasks, t)
	}
	held, err := s.store.Holds(ctx, tasks)
	r := s.recovery
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := map[string]bool{}
	now := time.Now()
	for i, k := range keys {
		// A record's task that asynq delivered again since it left here
		// (to another process, as its dequeue wrote; or, where dequeues
		// do not say, its lease set further ahead than this delivery's
		// could be) is another process's now: kept here, it would hold
		// on to a task that is not this process's.
		left, known := r.leftAt[k]
		redelivered := i < records && held != nil && held[i].Active &&
			(held[i].By != "" && held[i].By != r.reg.Process() ||
				known && !held[i].Lease.IsZero() && held[i].Lease.After(left.Add(asynqstore.Lease+2*time.Second)))
		if err == nil && (i < records && !held[i].Active || i >= records && !held[i].Deliverable) || redelivered {
			delete(r.kept, k)
			delete(r.leftAt, k)
			continue
		}
		since, ok := r.kept[k]
		if !ok {
			since = now
			r.kept[k] = now
		}
		if now.Sub(since) > asynqstore.Redelivery {
			delete(r.kept, k)
			delete(r.leftAt, k)
			continue
		}
		keep[k] = true
	}
	return keep
}

// judging reports whether this process may judge others dead now: its own
// beats have all landed for longer than a beat's deadline (three beats) and
// one more beat. A process whose beat is overdue then failed to beat while
// Redis took this one's: it is itself stopped, cut off or dead. Without
// this, a Redis that stalls for longer than the deadline (paused, loading,
// a failover) would make every live process look dead at once when it
// comes back, before their next beats land, and a live worker's task that
// its lock had lost meanwhile could be brought back while it runs again.
func (s *Server) judging() bool {
	r := s.recovery
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.landed.IsZero() && time.Since(r.landed) > 4*s.beatInterval()
}

// recoverDead brings back the locked tasks of every process whose beat is
// overdue and whose locks have expired.
func (s *Server) recoverDead(ctx context.Context) {
	if !s.judging() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dead, err := s.recovery.reg.Overdue(ctx, time.Now(), 16)
	if err != nil {
		s.log.Debug("recovery: reading the processes failed", "err", err)
		return
	}
	for _, p := range dead {
		if p != s.recovery.reg.Process() {
			s.recoverProcess(ctx, p)
		}
	}
}

// recoverProcess recovers dead process p's tasks whose locks it no longer
// holds, and forgets p once it has no hold record left.
func (s *Server) recoverProcess(ctx context.Context, p string) {
	reg := s.recovery.reg
	records, err := reg.Records(ctx, p)
	if err != nil {
		return
	}
	locked := map[string]bool{} // tasks with a hold record: their lock decides
	for _, rec := range records {
		if resource, queue, id, ok := lock.ParseHoldRecord(rec); ok && resource != "" {
			locked[lock.TaskWaiter(queue, id)] = true
		}
	}
	waiting := 0
	for _, rec := range records {
		resource, queue, id, ok := lock.ParseHoldRecord(rec)
		if !ok || resource == "" && locked[lock.TaskWaiter(queue, id)] {
			_, _ = reg.Claim(ctx, p, rec)
			continue
		}
		if resource == "" {
			// A task p held without a lock: back as soon as p is judged
			// dead, if it is still active in p's hands: the last dequeue
			// of it was p's (asynqstore.RecordDequeues writes that into
			// the task, and RecoverActive checks it in the same step). A
			// parked task that asynq delivered again meanwhile is left to
			// its new worker, and a live process's record of a task that
			// left its hands (kept while asynq has the task active, or a
			// hand-off's to a task that was still on its way back) holds
			// nothing back. A task no such dequeue delivered (an older
			// worker's) is left alone while a live process has a record of
			// it.
			if !s.stillDead(ctx, p) {
				return
			}
			held, err := s.store.Holds(ctx, []asynqstore.Task{{Queue: queue, ID: id}})
			if err != nil {
				continue // the record stays for the next look
			}
			if won, err := reg.Claim(ctx, p, rec); err != nil || !won {
				continue
			}
			if held[0].By == "" {
				if live, err := s.heldByLive(ctx, queue, id); err != nil || live {
					continue
				}
			}
			m, err := s.store.RecoverActive(ctx, queue, id, p)
			s.recovered(m, err, id, "", p)
			continue
		}
		if held, err := s.locker.HeldBy(ctx, resource, p); err != nil || held {
			waiting++ // its lease is not over yet (a paused process is not dead before it is)
			continue
		}
		if !s.stillDead(ctx, p) {
			return // it beat again meanwhile, or this process lost Redis for a moment
		}
		if won, err := reg.Claim(ctx, p, rec); err != nil || !won {
			continue // another recoverer has it
		}
		// First in its resource's queue: it came before every waiter
		// there, so it runs again as soon as the lock is free, within
		// TTL + 3 s (G7), not behind them. (A back end whose queue is not
		// in Redis has no Front: the task takes its turn as it comes.)
		_, ferr := s.locker.Front(ctx, resource, queue, id, s.waitersTTL())
		m, err := s.store.Recover(ctx, queue, id, p)
		if ferr == nil && (err != nil || m == nil) {
			_ = s.locker.Unfront(ctx, resource, queue, id)
		}
		s.recovered(m, err, id, resource, p)
	}
	if waiting == 0 {
		// Forget p (p alone: other dead processes may still have records),
		// unless it beat again meanwhile (a paused process resumed).
		_ = reg.Forget(ctx, p, time.Now())
	}
}

// heldByLive reports whether a live process (its beat not overdue) has a
// record of the task id of queue: it may run or wait there. For a task
// whose dequeue did not say whose it is (asynqstore.Held.By).
func (s *Server) heldByLive(ctx context.Context, queue, id string) (bool, error) {
	live, err := s.recovery.reg.Live(ctx, time.Now())
	if err != nil {
		return false, err
	}
	for _, p := range live {
		records, err := s.recovery.reg.Records(ctx, p)
		if err != nil {
			return false, err
		}
		for _, rec := range records {
			if _, q, i, ok := lock.ParseHoldRecord(rec); ok && q == queue && i == id {
				return true, nil
			}
		}
	}
	return false, nil
}

// recovered logs and counts the outcome of a recovery of task id that dead
// process p held on resource ("": without a lock).
func (s *Server) recovered(m *asynqstore.TaskMsg, err error, id, resource, p string) {
	switch {
	case err != nil:
		s.log.Warn("recovery: bringing back a dead worker's task failed; asynq's own lease recovery remains", "id", id, "err", err)
	case m != nil && resource == "":
		s.metrics.JobsRecovered.WithLabelValues(m.Type).Inc()
		s.log.Info("dead worker's task recovered: it held no lock; back at the head of its queue",
			"id", id, "type", m.Type, "worker", p)
	case m != nil:
		s.metrics.JobsRecovered.WithLabelValues(m.Type).Inc()
		s.log.Info("dead worker's task recovered: its lock expired; back at the head of its queue",
			"id", id, "type", m.Type, "resource", resource, "worker", p)
	}
}

// stillDead reports, just before a record of p is taken, that p's beat is
// still overdue and that this process may still judge.
func (s *Server) stillDead(ctx context.Context, p string) bool {
	overdue, err := s.recovery.reg.IsOverdue(ctx, p, time.Now())
	return err == nil && overdue && s.judging()
}

// leaveRecovery ends this process's part at a graceful stop: every lock it
// held is released and every task given back to asynq, so it has nothing
// left to recover; its records and its beat go. Unless asynq could not
// record a task's result or put it back (Redis away when it tried: "Could
// not move task"): such a task stays active in this process's name, where
// only asynq's own lease would bring it back, a minute or more later. The
// records of those tasks stay, and this process's beat ends now, so that a
// live worker's next recovery round brings them back (G7), as it would a
// dead worker's.
func (s *Server) leaveRecovery() {
	if s.recovery == nil {
		return
	}
	reg := s.recovery.reg
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	left, drop := s.stillActive(ctx)
	if len(left) == 0 {
		_ = reg.Leave(ctx)
		return
	}
	if err := reg.Remove(ctx, drop, nil); err != nil {
		s.log.Warn("recovery: leaving failed; this worker's tasks are brought back once its beat is over", "err", err)
		return
	}
	_ = reg.Beat(ctx, time.Now())
	s.log.Warn("worker stopped with tasks asynq still has active in its name; a live worker brings them back",
		"tasks", len(left), "ids", left)
}

// stillActive splits this process's records at its stop into the ids of
// the tasks asynq still has active in its name and the records to drop.
func (s *Server) stillActive(ctx context.Context) (left, drop []string) {
	reg := s.recovery.reg
	recs, err := reg.Records(ctx, reg.Process())
	if err != nil || len(recs) == 0 || s.store == nil {
		return nil, recs
	}
	tasks := make([]asynqstore.Task, 0, len(recs))
	var parsed []string // the records of tasks, in tasks' order
	for _, rec := range recs {
		if _, queue, id, ok := lock.ParseHoldRecord(rec); ok {
			tasks, parsed = append(tasks, asynqstore.Task{Queue: queue, ID: id}), append(parsed, rec)
		} else {
			drop = append(drop, rec)
		}
	}
	held, err := s.store.Holds(ctx, tasks)
	if err != nil {
		return nil, recs
	}
	for i, rec := range parsed {
		if held[i].Active && held[i].By == reg.Process() {
			left = append(left, tasks[i].ID)
		} else {
			drop = append(drop, rec)
		}
	}
	return left, drop
}
