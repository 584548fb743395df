package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
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
}

var scheduleName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// Validate checks the scheduler settings of c and every schedule: the cron
// expression and its time zone, and what the config package checks when it
// loads a file (so that a configuration built by hand is held to the same
// rules). Each problem is a *config.Error whose Field names the schedule and
// field, e.g. "schedules[0] (settle-orders).cron"; several are joined with
// errors.Join.
func Validate(c *config.SchedulerConfig) error {
	_, err := parseEntries(c)
	return err
}

func parseEntries(c *config.SchedulerConfig) ([]*entry, error) {
	var errs []error
	fail := func(i int, name, field, format string, args ...any) {
		at := fmt.Sprintf("schedules[%d]", i)
		if name != "" {
			at += " (" + name + ")"
		}
		errs = append(errs, &config.Error{Field: at + "." + field, Msg: fmt.Sprintf(format, args...)})
	}
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
	first := make(map[string]int)
	entries := make([]*entry, 0, len(c.Schedules))
	for i, s := range c.Schedules {
		switch j, dup := first[s.Name]; {
		case !scheduleName.MatchString(s.Name):
			fail(i, s.Name, "name", "invalid name %q (use letters, digits, '_', '.' and '-')", s.Name)
		case dup:
			fail(i, s.Name, "name", "duplicate name %q, first used by schedules[%d]", s.Name, j)
		default:
			first[s.Name] = i
		}
		loc, err := time.LoadLocation(s.Timezone)
		if s.Timezone == "Local" || err != nil {
			fail(i, s.Name, "timezone", "unknown time zone %q", s.Timezone)
			loc = time.UTC
		}
		spec, err := ParseSpec(s.Cron, loc)
		if err != nil {
			fail(i, s.Name, "cron", "%v", err)
		}
		if s.Task == "" {
			fail(i, s.Name, "task", "required")
		}
		if s.Queue == "" {
			fail(i, s.Name, "queue", "required")
		}
		if len(s.Payload) > 0 {
			var obj map[string]json.RawMessage
			if json.Unmarshal(s.Payload, &obj) != nil || obj == nil {
				fail(i, s.Name, "payload", "must be a JSON object")
			}
		}
		if s.MaxRetry < 0 {
			fail(i, s.Name, "max_retry", "must be at least 0, got %d", s.MaxRetry)
		}
		if s.Timeout < 0 {
			fail(i, s.Name, "timeout", "must be at least 0, got %v", s.Timeout)
		}
		switch s.CatchUp {
		case config.CatchUpSkip, config.CatchUpOnce, config.CatchUpAll:
		case "":
			s.CatchUp = config.CatchUpSkip
		default:
			fail(i, s.Name, "catch_up", "must be skip, once or all, got %q", s.CatchUp)
		}
		capN := s.MaxCatchUp
		if capN == 0 {
			capN = c.Scheduler.MaxCatchUp
		}
		if capN <= 0 {
			fail(i, s.Name, "max_catch_up", "must be greater than 0, got %d", capN)
		}
		entries = append(entries, &entry{
			name: s.Name, spec: spec, task: s.Task, payload: s.Payload, queue: s.Queue,
			maxRetry: s.MaxRetry, timeout: s.Timeout, catchUp: s.CatchUp, maxCatchUp: capN,
			keys: keysFor(c.Lock.Prefix, s.Name),
		})
	}
	switch len(errs) {
	case 0:
		return entries, nil
	case 1:
		return nil, errs[0] // kept bare, so that callers can type-assert it
	}
	return nil, errors.Join(errs...)
}
