package scheduler

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"
)

// syncer keeps this replica's schedules equal to the file's plus the
// run-time ones in Redis: it applies a change when its pub/sub notice
// arrives, and checks the version every resync interval in case a notice was
// lost (a reconnect), so that a change is applied within about a second.
func (s *Scheduler) syncer(loops context.Context) {
	ps := s.client.Subscribe(loops, s.store.k.channel)
	defer ps.Close()
	notices := ps.Channel()
	t := time.NewTicker(s.resync)
	defer t.Stop()
	h := health{log: s.log, what: "schedule sync"}
	registered := false
	defer func() {
		if !s.crashed.Load() { // a clean stop: the others take this replica's share at once
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _, _ = s.store.heartbeat(ctx, s.id, false)
		}
	}()
	for {
		if !registered {
			registered = s.store.registerFile(loops, s.id, s.file) == nil
		}
		if live, isNew, err := s.store.heartbeat(loops, s.id, true); err == nil {
			s.replicas.Store(&live)
			if isNew {
				registered = false // it had been gone (a long pause): declare the file schedules again
			}
		} else {
			s.replicas.Store(nil) // claim everything while the view is unknown
		}
		v, err := s.store.version(loops)
		if err == nil && v != s.applied.Load() {
			err = s.syncOnce(loops)
		}
		if loops.Err() != nil {
			return
		}
		h.report(err)
		select {
		case <-notices:
			// Notices that came in meanwhile are covered by this one load.
			for len(notices) > 0 {
				<-notices
			}
			h.report(s.syncOnce(loops))
		case <-t.C:
		case <-loops.Done():
			return
		}
	}
}

// syncOnce loads the run-time schedules and applies them.
func (s *Scheduler) syncOnce(ctx context.Context) error {
	snap, err := s.store.load(ctx)
	if err != nil {
		return err
	}
	s.apply(snap)
	s.applied.Store(snap.version)
	return nil
}

// apply starts the loops of schedules that are new or changed (a changed
// one's old loop stops first; a tick in flight finishes), stops those of
// removed or paused ones, and leaves the others running.
func (s *Scheduler) apply(snap snapshot) {
	want := make(map[string]*entry, len(s.file)+len(snap.defs))
	paused := map[string]bool{}
	for _, e := range s.file {
		if snap.meta[e.name].Paused {
			paused[e.name] = true
			continue
		}
		want[e.name] = e
	}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for name, raw := range snap.defs {
		if slices.ContainsFunc(s.file, func(e *entry) bool { return e.name == name }) {
			if !s.shadow[name] {
				s.shadow[name] = true
				s.log.Warn("run-time schedule ignored: the config file has a schedule of that name", "schedule", name)
			}
			continue
		}
		m := snap.meta[name]
		if m.Paused {
			paused[name] = true
			continue
		}
		version := raw + "\n" + strconv.FormatInt(m.Since, 10)
		if cur, ok := s.live[name]; ok && cur.e.version == version {
			want[name] = cur.e
			continue
		}
		e, err := s.runtimeEntry(raw, m.Since)
		if err != nil {
			s.log.Error("run-time schedule ignored: invalid definition", "schedule", name, "err", err)
			continue
		}
		e.version = version
		want[name] = e
	}
	for _, name := range slices.Sorted(maps.Keys(s.live)) {
		cur := s.live[name]
		if want[name] != cur.e {
			cur.stop()
			delete(s.live, name)
			s.dropSeries(cur.e)
			what := "removed"
			switch {
			case paused[name]:
				what = "paused"
			case want[name] != nil:
				what = "changed"
			}
			s.log.Info("schedule "+what, "schedule", name, "source", cur.e.source)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.live[name]; ok {
			continue
		}
		e := want[name]
		ctx, stop := context.WithCancel(s.loops)
		s.live[name] = &liveEntry{e: e, stop: stop}
		s.initSeries(e)
		if e.source == SourceRuntime || s.paused[name] {
			s.log.Info("schedule started", "schedule", name, "source", e.source, "cron", e.spec.String())
		}
		s.wg.Go(func() { s.loop(ctx, s.fires, e) })
	}
	s.paused = paused
	counts := map[[2]string]int{}
	for _, l := range s.live {
		counts[[2]string{l.e.source, "running"}]++
	}
	for name := range paused {
		src := SourceRuntime
		if slices.ContainsFunc(s.file, func(e *entry) bool { return e.name == name }) {
			src = SourceFile
		}
		counts[[2]string{src, "paused"}]++
	}
	for _, src := range []string{SourceFile, SourceRuntime} {
		for _, state := range []string{"running", "paused"} {
			s.m.SchedulerSchedules.WithLabelValues(src, state).Set(float64(counts[[2]string{src, state}]))
		}
	}
}

// runtimeEntry builds the entry of a stored run-time schedule.
func (s *Scheduler) runtimeEntry(raw string, since int64) (*entry, error) {
	def, err := decodeDef(raw)
	if err != nil {
		return nil, err
	}
	if err := CheckSchedule(&def); err != nil {
		return nil, err
	}
	e, err := newEntry(def, s.prefix, s.maxCatch)
	if err != nil {
		return nil, err
	}
	e.source, e.since = SourceRuntime, since
	return e, nil
}

// liveEntries returns the schedules whose loops run, in name order.
func (s *Scheduler) liveEntries() []*entry {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	out := make([]*entry, 0, len(s.live))
	for _, name := range slices.Sorted(maps.Keys(s.live)) {
		out = append(out, s.live[name].e)
	}
	return out
}

var tickResults = []string{ResultEnqueued, ResultFollower, ResultDuplicate, ResultMissed, ResultCaughtUp, ResultSkippedOverlap, ResultSkippedPaused, ResultBackfilled}

// initSeries chooses e's series label (its name for file schedules and the
// first maxLabeledRuntime run-time ones, else OtherSchedules) and puts its
// tick series at zero, so that the first event shows in rate(). Called with
// liveMu held.
func (s *Scheduler) initSeries(e *entry) {
	if e.source == SourceRuntime { // a new entry; a file entry has its label from the start
		e.label = e.name
		if s.labeled >= maxLabeledRuntime {
			e.label = OtherSchedules
		} else {
			s.labeled++
		}
	}
	for _, r := range tickResults {
		s.m.SchedulerTicks.WithLabelValues(e.label, r)
	}
}

// dropSeries removes the series of a schedule that stopped (removed,
// paused, changed), so that removed schedules do not accumulate and alerts
// on silent schedules skip paused ones. Called with liveMu held.
func (s *Scheduler) dropSeries(e *entry) {
	if e.label != e.name {
		return // OtherSchedules: shared
	}
	if e.source == SourceRuntime {
		s.labeled--
	}
	for _, r := range tickResults {
		s.m.SchedulerTicks.DeleteLabelValues(e.label, r)
	}
}
