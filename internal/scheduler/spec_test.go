package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/config"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// ticks returns the first n ticks of expr in zone after from.
func ticks(t *testing.T, expr, zone string, from time.Time, n int) []time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSpec(expr, loc)
	if err != nil {
		t.Fatalf("ParseSpec(%q): %v", expr, err)
	}
	var out []time.Time
	for range n {
		from = s.Next(from)
		out = append(out, from.UTC())
	}
	return out
}

func equalTimes(t *testing.T, what string, got, want []time.Time) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d ticks %v, want %v", what, len(got), got, want)
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			t.Fatalf("%s: tick %d is %v, want %v (all: %v)", what, i, got[i], want[i], got)
		}
	}
}

func TestParseSpecForms(t *testing.T) {
	t.Parallel()
	from := utc("2024-05-10T10:00:00Z")
	for _, tc := range []struct {
		expr, zone string
		want       []string
	}{
		{"*/5 * * * * *", "UTC", []string{"2024-05-10T10:00:05Z", "2024-05-10T10:00:10Z"}},
		{"*/15 * * * *", "UTC", []string{"2024-05-10T10:15:00Z", "2024-05-10T10:30:00Z"}},
		{"@hourly", "UTC", []string{"2024-05-10T11:00:00Z", "2024-05-10T12:00:00Z"}},
		{"@daily", "Europe/Berlin", []string{"2024-05-10T22:00:00Z", "2024-05-11T22:00:00Z"}},
		{"0 9 * * mon", "UTC", []string{"2024-05-13T09:00:00Z", "2024-05-20T09:00:00Z"}},
		{"CRON_TZ=America/New_York 0 9 * * *", "UTC", []string{"2024-05-10T13:00:00Z", "2024-05-11T13:00:00Z"}},
		{"TZ=Asia/Tokyo 0 0 9 * * *", "Europe/Berlin", []string{"2024-05-11T00:00:00Z", "2024-05-12T00:00:00Z"}},
		{"@every 7s", "UTC", []string{"2024-05-10T10:00:02Z", "2024-05-10T10:00:09Z"}}, // 1715335200 = 7·245047885 + 5
		{"@every 1h30m", "Europe/Berlin", []string{"2024-05-10T10:30:00Z", "2024-05-10T12:00:00Z"}},
	} {
		var want []time.Time
		for _, w := range tc.want {
			want = append(want, utc(w))
		}
		equalTimes(t, tc.expr, ticks(t, tc.expr, tc.zone, from, len(want)), want)
	}
}

// Replicas that start at different times must agree on @every ticks.
func TestEveryIsAlignedToTheEpoch(t *testing.T) {
	t.Parallel()
	s, err := ParseSpec("@every 13s", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, start := range []time.Time{utc("2024-01-01T00:00:00Z"), utc("2024-01-01T00:00:00Z").Add(4711 * time.Millisecond), time.Now()} {
		for n, k := s.Next(start), 0; k < 50; n, k = s.Next(n), k+1 {
			if n.Unix()%13 != 0 || n.Nanosecond() != 0 || !n.After(start) {
				t.Fatalf("from %v: tick %v is not a multiple of 13s since the epoch", start, n)
			}
		}
	}
}

func TestParseSpecErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ expr, want string }{
		{"", "empty cron expression"},
		{"* * *", `invalid cron expression "* * *"`},
		{"61 * * * *", `invalid cron expression "61 * * * *"`},
		{"@fortnightly", `invalid cron expression "@fortnightly"`},
		{"@every 1500ms", "@every 1500ms: must be a whole number of seconds"},
		{"@every 500ms", "@every 500ms: must be at least 1s"},
		{"@every soon", "@every soon: invalid duration"},
		{"CRON_TZ=Mars/Olympus * * * * *", `unknown time zone "Mars/Olympus"`},
		{"CRON_TZ=Local * * * * *", "name a time zone such as UTC"},
		{"CRON_TZ=UTC", "no expression after the time zone"}, // robfig/cron panics on this one
		{"0 0 30 2 *", "never fires"},
	} {
		_, err := ParseSpec(tc.expr, time.UTC)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%q) = %v, want an error containing %q", tc.expr, err, tc.want)
		}
	}
}

// Daylight saving in Europe/Berlin, 2024: clocks jump from 02:00 CET to
// 03:00 CEST on 31 March (01:00 UTC) and fall back from 03:00 CEST to 02:00
// CET on 27 October (01:00 UTC). This is the behaviour documented in ParseSpec.
func TestDaylightSavingChanges(t *testing.T) {
	t.Parallel()
	const berlin = "Europe/Berlin"
	for _, tc := range []struct {
		name, expr string
		from       string
		want       []string
	}{
		{"fixed time in the skipped hour fires at the jump", "30 2 * * *", "2024-03-30T00:00:00Z",
			[]string{"2024-03-30T01:30:00Z", "2024-03-31T01:00:00Z", "2024-04-01T00:30:00Z"}},
		{"several fixed times in the skipped hour fire once", "*/30 2 * * *", "2024-03-30T23:00:00Z",
			[]string{"2024-03-31T01:00:00Z", "2024-04-01T00:00:00Z", "2024-04-01T00:30:00Z"}},
		{"fixed time in the repeated hour fires in the first pass only", "30 2 * * *", "2024-10-26T00:00:00Z",
			[]string{"2024-10-26T00:30:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"}},
		{"fixed hour with seconds field, repeated hour", "0 */30 2 * * *", "2024-10-26T23:00:00Z",
			[]string{"2024-10-27T00:00:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:00:00Z"}},
		{"hourly follows elapsed time over the jump", "0 * * * *", "2024-03-30T23:30:00Z",
			[]string{"2024-03-31T00:00:00Z", "2024-03-31T01:00:00Z", "2024-03-31T02:00:00Z"}},
		{"hourly fires in both passes of the repeated hour", "0 * * * *", "2024-10-26T23:30:00Z",
			[]string{"2024-10-27T00:00:00Z", "2024-10-27T01:00:00Z", "2024-10-27T02:00:00Z"}},
		{"daily descriptor over the jump", "@daily", "2024-03-29T12:00:00Z",
			[]string{"2024-03-29T23:00:00Z", "2024-03-30T23:00:00Z", "2024-03-31T22:00:00Z"}},
	} {
		var want []time.Time
		for _, w := range tc.want {
			want = append(want, utc(w))
		}
		equalTimes(t, tc.name, ticks(t, tc.expr, berlin, utc(tc.from), len(want)), want)
	}
}

func TestValidateNamesScheduleAndField(t *testing.T) {
	t.Parallel()
	base := func() *config.SchedulerConfig {
		c := config.DefaultScheduler()
		c.Schedules = []config.Schedule{{Name: "settle-orders", Cron: "* * * * * *", Timezone: "UTC", Task: "t", Queue: "default", CatchUp: config.CatchUpSkip}}
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*config.SchedulerConfig)
		want string
	}{
		{"cron", func(c *config.SchedulerConfig) { c.Schedules[0].Cron = "every day" },
			`schedules[0] (settle-orders).cron: invalid cron expression "every day"`},
		{"every", func(c *config.SchedulerConfig) { c.Schedules[0].Cron = "@every 2.5s" },
			"schedules[0] (settle-orders).cron: @every 2.5s: must be a whole number of seconds"},
		{"zone", func(c *config.SchedulerConfig) { c.Schedules[0].Timezone = "Europe/Atlantis" },
			`schedules[0] (settle-orders).timezone: unknown time zone "Europe/Atlantis"`},
		{"duplicate", func(c *config.SchedulerConfig) { c.Schedules = append(c.Schedules, c.Schedules[0]) },
			`schedules[1] (settle-orders).name: duplicate name "settle-orders", first used by schedules[0]`},
		{"payload", func(c *config.SchedulerConfig) { c.Schedules[0].Payload = []byte(`[1,2]`) },
			"schedules[0] (settle-orders).payload: must be a mapping (JSON object), got a list"},
		{"retention", func(c *config.SchedulerConfig) { c.Scheduler.TaskRetention = 5 * time.Second },
			"scheduler.task_retention: must be greater than 2 × scheduler.max_clock_skew + scheduler.tick_lock_ttl (9s), got 5s"},
		{"catch_up", func(c *config.SchedulerConfig) { c.Schedules[0].CatchUp = "sometimes" },
			`schedules[0] (settle-orders).catch_up: must be skip, once or all, got "sometimes"`},
	} {
		c := base()
		tc.edit(c)
		err := Validate(c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
			continue
		}
		if _, ok := errors.AsType[*config.Error](err); !ok {
			t.Errorf("%s: %T is not a *config.Error", tc.name, err)
		}
	}
	if err := Validate(base()); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

func TestBetween(t *testing.T) {
	t.Parallel()
	s, err := ParseSpec("* * * * * *", nil)
	if err != nil {
		t.Fatal(err)
	}
	from := utc("2024-01-01T00:00:00Z")
	last, n, exact := between(s, from, from.Add(10*time.Second), 3)
	if n != 10 || !exact {
		t.Fatalf("n, exact = %d, %v; want 10, true", n, exact)
	}
	equalTimes(t, "last 3", last, []time.Time{from.Add(8 * time.Second), from.Add(9 * time.Second), from.Add(10 * time.Second)})

	// A year of seconds: the walk jumps ahead but still ends with the latest ticks.
	until := from.AddDate(1, 0, 0)
	start := time.Now()
	last, n, exact = between(s, from, until, 2)
	if exact || n < scanBudget || time.Since(start) > 10*time.Second {
		t.Fatalf("n, exact = %d, %v after %v; want a lower bound, quickly", n, exact, time.Since(start))
	}
	equalTimes(t, "last 2 of a year", last, []time.Time{until.Add(-time.Second), until})
}
