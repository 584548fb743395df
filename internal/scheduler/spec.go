package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // zones must not depend on the host's zoneinfo: every replica must agree

	"github.com/robfig/cron/v3"
)

// Spec is a parsed cron expression: the tick times of one schedule. Next is a
// pure function of its argument, so every replica computes the same ticks.
type Spec interface {
	// Next returns the first tick strictly after t, a whole Unix second, or
	// the zero time when there is none within five years.
	Next(t time.Time) time.Time
	String() string
}

// parser takes 5 fields, or 6 with seconds first, and descriptors.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// starBit is robfig/cron's mark of a field written as * or */n.
const starBit = 1 << 63

// ParseSpec parses a cron expression in loc (nil: UTC):
//
//   - 5 fields (minute first) or 6 (seconds first): "*/5 * * * * *";
//   - descriptors: @yearly, @monthly, @weekly, @daily, @midnight, @hourly;
//   - "@every D": every D since the Unix epoch, so that every replica has the
//     same ticks whenever it started; D must be a whole number of seconds;
//   - a "CRON_TZ=Zone " (or "TZ=Zone ") prefix, which overrides loc.
//
// Across daylight-saving changes, schedules with a fixed hour field (not * or
// */n, e.g. "30 2 * * *" or @daily) fire once per wall-clock time: ticks in a
// skipped hour fire once at the first instant after it, and a repeated hour
// fires only in its first pass. Schedules whose hour field is * or */n follow
// elapsed time: nothing extra in a skipped hour, both passes of a repeated one.
func ParseSpec(expr string, loc *time.Location) (Spec, error) {
	if loc == nil {
		loc = time.UTC
	}
	rest := strings.TrimSpace(expr)
	if rest == "" {
		return nil, errors.New("empty cron expression")
	}
	if strings.HasPrefix(rest, "CRON_TZ=") || strings.HasPrefix(rest, "TZ=") {
		prefix, after, _ := strings.Cut(rest, " ")
		_, zone, _ := strings.Cut(prefix, "=")
		rest = strings.TrimSpace(after)
		switch l, err := time.LoadLocation(zone); {
		case zone == "" || zone == "Local":
			return nil, fmt.Errorf("%q: name a time zone such as UTC (Local differs between hosts)", prefix)
		case err != nil:
			return nil, fmt.Errorf("%q: unknown time zone %q", prefix, zone)
		case rest == "":
			return nil, fmt.Errorf("%q: no expression after the time zone", expr)
		default:
			loc = l
		}
	}
	if d, ok := strings.CutPrefix(rest, "@every "); ok {
		return parseEvery(strings.TrimSpace(d))
	}
	s, err := parser.Parse(rest)
	if err != nil {
		return nil, fmt.Errorf("invalid cron expression %q: %v", expr, err)
	}
	sc, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("invalid cron expression %q: unsupported form", expr)
	}
	sc.Location = loc
	wall := *sc
	wall.Location = time.UTC
	c := &cronSpec{expr: expr, s: sc, wall: &wall, loc: loc, fixedHour: sc.Hour&starBit == 0}
	if c.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron expression %q never fires (no tick within five years)", expr)
	}
	return c, nil
}

func parseEvery(s string) (Spec, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("@every %s: invalid duration", s)
	case d < time.Second:
		return nil, fmt.Errorf("@every %s: must be at least 1s", s)
	case d%time.Second != 0:
		// Ticks are identified by their Unix second, and an epoch-aligned
		// sub-second period would put two ticks in one second or drift.
		return nil, fmt.Errorf("@every %s: must be a whole number of seconds, so that every replica has the same ticks", s)
	}
	return every{d: int64(d / time.Second)}, nil
}

// every ticks at each multiple of d seconds since the Unix epoch.
type every struct{ d int64 }

func (e every) Next(t time.Time) time.Time {
	u := t.Unix() // floor for t at or after the epoch
	return time.Unix((u/e.d+1)*e.d, 0).UTC()
}

func (e every) String() string { return "@every " + (time.Duration(e.d) * time.Second).String() }

// cronSpec is a robfig/cron schedule with defined daylight-saving behaviour.
type cronSpec struct {
	expr      string
	s         *cron.SpecSchedule // in loc
	wall      *cron.SpecSchedule // the same fields in UTC: matches wall-clock readings
	loc       *time.Location
	fixedHour bool
}

func (c *cronSpec) String() string { return c.expr }

func (c *cronSpec) Next(t time.Time) time.Time {
	for range 8 { // each round moves past one repeated interval; a few suffice
		n := c.s.Next(t)
		if n.IsZero() || !c.fixedHour {
			return n
		}
		if g, ok := c.skippedMatch(t, n); ok {
			return g
		}
		if end, ok := repeated(n.In(c.loc)); ok {
			t = end.Add(-time.Second) // the second pass: go on after it
			continue
		}
		return n
	}
	return time.Time{}
}

// skippedMatch returns the first forward transition in (t, n] whose skipped
// wall-clock readings include a tick: that tick fires at the transition.
func (c *cronSpec) skippedMatch(t, n time.Time) (time.Time, bool) {
	_, end := t.In(c.loc).ZoneBounds()
	for range 32 { // transitions within five years
		if end.IsZero() || end.After(n) {
			return time.Time{}, false
		}
		_, before := end.Add(-time.Second).In(c.loc).Zone()
		_, after := end.In(c.loc).Zone()
		if after > before {
			from, to := wallClock(end, before), wallClock(end, after)
			if m := c.wall.Next(from.Add(-time.Second)); !m.IsZero() && m.Before(to) {
				return end.UTC(), true
			}
		}
		_, end = end.In(c.loc).ZoneBounds()
	}
	return time.Time{}, false
}

// repeated reports whether t falls in the second pass of a repeated interval
// (a clock set back), and when that interval ends.
func repeated(t time.Time) (time.Time, bool) {
	start, _ := t.ZoneBounds()
	if start.IsZero() {
		return time.Time{}, false
	}
	_, after := t.Zone()
	_, before := start.Add(-time.Second).In(t.Location()).Zone()
	end := start.Add(time.Duration(before-after) * time.Second)
	return end, before > after && t.Before(end)
}

// wallClock returns the reading of a clock at offset off at instant t, as a
// UTC time whose fields are that reading.
func wallClock(t time.Time, off int) time.Time {
	return time.Unix(t.Unix()+int64(off), 0).UTC()
}
