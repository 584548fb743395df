package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
)

// entry is one validated schedule.
type entry struct {
	name       string
	spec       Spec
	task       string
	payload    []byte
	queue      string
	maxRetry   int
	timeout    time.Duration
	catchUp    config.CatchUp
	maxCatchUp int
	keys       keys
	def        config.Schedule // as validated, defaults filled

	source string // SourceFile or SourceRuntime
	// since is when the current cron and time zone of a run-time schedule
	// took effect (Unix seconds, Redis's clock; 0 for a file schedule): no
	// tick at or before it is due, so a changed spec never replays old ticks.
	since int64
	// version identifies the definition, to notice a change (file: "").
	version string
	// label is the schedule label of its tick series: its name, or
	// OtherSchedules for run-time schedules beyond maxLabeledRuntime.
	label string
	// digest is nameDigest(name), for claim digests.
	digest uint64
	// unsettled is the latest tick (Unix seconds) that this replica did not
	// see done: another replica had it, or it may still be pending. Only
	// schedules with one lately are swept between full sweeps.
	unsettled atomic.Int64
}

// unsettle records that tick may still be pending.
func (e *entry) unsettle(tick int64) {
	for {
		cur := e.unsettled.Load()
		if cur >= tick || e.unsettled.CompareAndSwap(cur, tick) {
			return
		}
	}
}

// OtherSchedules is the schedule label of the tick series of the run-time
// schedules beyond the first maxLabeledRuntime on a replica, so that 10,000
// schedules do not make 50,000 series.
const OtherSchedules = "_other"

// maxLabeledRuntime is how many run-time schedules have their own series.
const maxLabeledRuntime = 100

// Where a schedule comes from.
const (
	SourceFile    = "file"    // the config file (or LOCKSTEP_SCHEDULES)
	SourceRuntime = "runtime" // stored in Redis by the schedules API or the lockstep CLI
)

// Validate checks the scheduler settings of c and every schedule: what the
// config package checks when it loads a file (so that a configuration built
// by hand is held to the same rules), and the cron expression in its time
// zone. Each problem is a *config.Error whose Field names the schedule and
// field, e.g. "schedules[0] (settle-orders).cron"; several are joined with
// errors.Join.
func Validate(c *config.SchedulerConfig) error {
	_, err := parseEntries(c)
	return err
}

// CheckSchedule validates a schedule defined at run time exactly as a config
// file's entry is validated (config.CheckSchedule), and its cron expression,
// and fills its defaults. Fields are "schedule (NAME).FIELD".
func CheckSchedule(s *config.Schedule) error {
	errs := []error{config.CheckSchedule(s)}
	if s.Cron != "" {
		errs = append(errs, checkCron(s, "schedule ("+s.Name+")"))
	}
	return joinBare(errs)
}

// checkCron parses s's expression in its time zone (a bad zone is reported
// by the config checks, so UTC stands in for it here).
func checkCron(s *config.Schedule, at string) error {
	loc, err := time.LoadLocation(s.Timezone)
	if s.Timezone == "Local" || err != nil {
		loc = time.UTC
	}
	if _, err := ParseSpec(s.Cron, loc); err != nil {
		return &config.Error{Field: at + ".cron", Msg: err.Error()}
	}
	return nil
}

func parseEntries(c *config.SchedulerConfig) ([]*entry, error) {
	var errs []error
	set := c.Scheduler
	switch {
	case set.MaxClockSkew < 0:
		errs = append(errs, &config.Error{Field: "scheduler.max_clock_skew", Msg: fmt.Sprintf("must be at least 0, got %v", set.MaxClockSkew)})
	case set.TickLockTTL < time.Millisecond:
		errs = append(errs, &config.Error{Field: "scheduler.tick_lock_ttl", Msg: fmt.Sprintf("must be at least 1ms, got %v", set.TickLockTTL)})
	case set.TaskRetention <= 2*set.MaxClockSkew+set.TickLockTTL:
		// Past retention a task id is forgotten; a takeover must happen well
		// before, or it could enqueue a tick whose first task is gone.
		errs = append(errs, &config.Error{Field: "scheduler.task_retention", Msg: fmt.Sprintf(
			"must be greater than 2 × scheduler.max_clock_skew + scheduler.tick_lock_ttl (%v), got %v",
			2*set.MaxClockSkew+set.TickLockTTL, set.TaskRetention)})
	}
	if set.MaxCatchUp <= 0 {
		errs = append(errs, &config.Error{Field: "scheduler.max_catch_up", Msg: fmt.Sprintf("must be greater than 0, got %d", set.MaxCatchUp)})
	}
	// The config package's checks, on a copy: the caller's config stays as it was.
	cc := *c
	cc.Schedules = slices.Clone(c.Schedules)
	errs = append(errs, config.CheckSchedules(&cc))
	entries := make([]*entry, 0, len(cc.Schedules))
	for i := range cc.Schedules {
		s := &cc.Schedules[i]
		at := fmt.Sprintf("schedules[%d]", i)
		if s.Name != "" {
			at += " (" + s.Name + ")"
		}
		if s.Cron != "" {
			if err := checkCron(s, at); err != nil {
				errs = append(errs, err)
			}
		}
		e, err := newEntry(*s, c.Lock.Prefix, set.MaxCatchUp)
		if err == nil {
			e.source, e.label = SourceFile, e.name
			entries = append(entries, e)
		}
	}
	if err := joinBare(errs); err != nil {
		return nil, err
	}
	return entries, nil
}

// newEntry builds the entry of a validated schedule; a max_catch_up of 0 is
// defaultCatchUp.
func newEntry(s config.Schedule, prefix string, defaultCatchUp int) (*entry, error) {
	loc, err := time.LoadLocation(s.Timezone)
	if err != nil {
		return nil, err
	}
	spec, err := ParseSpec(s.Cron, loc)
	if err != nil {
		return nil, err
	}
	s.Overlap = cmp.Or(s.Overlap, config.OverlapAllow) // stored before overlap existed
	return &entry{
		name: s.Name, spec: spec, task: s.Task, payload: s.Payload, queue: s.Queue,
		maxRetry: s.MaxRetry, timeout: s.Timeout, catchUp: s.CatchUp,
		maxCatchUp: cmp.Or(s.MaxCatchUp, defaultCatchUp), keys: keysFor(prefix, s.Name), def: s,
		digest: nameDigest(s.Name),
	}, nil
}

// joinBare drops nil errors, flattens joined ones and keeps a single error
// bare, so that callers can type-assert it.
func joinBare(errs []error) error {
	var flat []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			flat = append(flat, j.Unwrap()...)
		} else if err != nil {
			flat = append(flat, err)
		}
	}
	switch len(flat) {
	case 0:
		return nil
	case 1:
		return flat[0]
	}
	return errors.Join(flat...)
}
