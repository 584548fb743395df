package config

import (
	"cmp"
	"encoding/json"
	"time"
)

// NewSchedule returns a schedule holding the defaults that a config file's
// entry starts from (time zone UTC, queue default, max_retry 5, catch_up
// skip), for schedules defined at run time.
func NewSchedule() Schedule {
	var s Schedule
	s.setDefaults()
	return s
}

// CheckSchedule validates one schedule defined outside a file (at run time)
// with exactly the rules and messages of a config file's entry, and fills
// its defaults as loading does, except max_catch_up, which stays 0 (each
// replica's scheduler.max_catch_up). The cron syntax is the scheduler
// package's to check. Each problem is an *Error whose Field is
// "schedule (NAME).FIELD"; several are joined.
func CheckSchedule(s *Schedule) error {
	v := validator{origins: origins{}}
	p := fieldPath{key: "schedule", show: "schedule"}
	if s.Name != "" {
		p.show += " (" + s.Name + ")"
	}
	s.check(&v, p, 0)
	return join(v.errs)
}

// CheckSchedules validates c's schedules as LoadScheduler does (names,
// duplicates, every field; not the cron syntax), for a configuration built
// in code, and fills their defaults. Fields are "schedules[I] (NAME).FIELD".
func CheckSchedules(c *SchedulerConfig) error {
	v := validator{origins: origins{}}
	c.checkSchedules(&v)
	return join(v.errs)
}

func (c *SchedulerConfig) checkSchedules(v *validator) {
	first := make(map[string]int) // schedule name -> index of its first use
	for i := range c.Schedules {
		sc := &c.Schedules[i]
		p := root.field("schedules").index(i, sc.Name)
		if j, dup := first[sc.Name]; dup && sc.Name != "" {
			v.fail(p.field("name"), "duplicate name %q, first used by schedules[%d]", sc.Name, j)
		} else if !dup {
			first[sc.Name] = i
		}
		sc.check(v, p, c.Scheduler.MaxCatchUp)
	}
}

// check validates one schedule at p; a max_catch_up of 0 becomes
// defaultCatchUp unless that is 0 too.
func (sc *Schedule) check(v *validator, p fieldPath, defaultCatchUp int) {
	switch {
	case sc.Name == "":
		v.fail(p.field("name"), "required")
	case !scheduleName.MatchString(sc.Name):
		v.fail(p.field("name"), "invalid name %q (use letters, digits, '_', '.' and '-')", sc.Name)
	}
	required(v, p, "cron", sc.Cron)
	required(v, p, "task", sc.Task)
	required(v, p, "queue", sc.Queue)
	sc.Timezone = cmp.Or(sc.Timezone, "UTC")
	if sc.Timezone == "Local" { // differs between hosts, so replicas would disagree on ticks
		v.fail(p.field("timezone"), `"Local" is not allowed; name a zone such as UTC`)
	} else if _, err := time.LoadLocation(sc.Timezone); err != nil {
		v.fail(p.field("timezone"), "unknown time zone %q", sc.Timezone)
	}
	if len(sc.Payload) > 0 {
		// A file's payload is a YAML mapping made JSON by the decoder; one
		// given as JSON at run time must be an object as well.
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(sc.Payload, &obj); err != nil || obj == nil {
			v.fail(p.field("payload"), "must be a mapping (JSON object), got %s", jsonKind(sc.Payload))
		}
	}
	atLeast(v, p.field("max_retry"), sc.MaxRetry, 0)
	atLeast(v, p.field("timeout"), sc.Timeout, 0)
	oneOf(v, p.field("catch_up"), sc.CatchUp, CatchUpSkip, CatchUpOnce, CatchUpAll)
	atLeast(v, p.field("max_catch_up"), sc.MaxCatchUp, 0)
	sc.Overlap = cmp.Or(sc.Overlap, OverlapAllow)
	oneOf(v, p.field("overlap"), sc.Overlap, OverlapAllow, OverlapSkip, OverlapBufferOne, OverlapCancelPrevious)
	if sc.MaxCatchUp == 0 {
		sc.MaxCatchUp = defaultCatchUp
	}
}

// jsonKind describes a payload that is not a JSON object.
func jsonKind(b []byte) string {
	var x any
	if json.Unmarshal(b, &x) != nil {
		return "invalid JSON"
	}
	switch x.(type) {
	case []any:
		return "a list"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "invalid JSON"
}
