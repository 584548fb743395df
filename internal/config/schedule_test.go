package config

import (
	"encoding/json"
	"strings"
	"testing"
)

// A run-time schedule is held to a file entry's rules, with the same
// messages, located at "schedule (NAME)".
func TestCheckSchedule(t *testing.T) {
	t.Parallel()
	ok := NewSchedule()
	ok.Name, ok.Cron, ok.Task = "acme", "@hourly", "t"
	if err := CheckSchedule(&ok); err != nil {
		t.Fatalf("valid: %v", err)
	}
	if ok.Timezone != "UTC" || ok.Queue != "default" || ok.MaxRetry != 5 || ok.CatchUp != CatchUpSkip || ok.MaxCatchUp != 0 {
		t.Errorf("defaults: %+v", ok)
	}
	for _, tc := range []struct {
		edit func(*Schedule)
		want string
	}{
		{func(s *Schedule) { s.Name = "a:b" }, `schedule (a:b).name: invalid name "a:b" (use letters, digits, '_', '.' and '-')`},
		{func(s *Schedule) { s.Name = "" }, `schedule.name: required`},
		{func(s *Schedule) { s.Task = "" }, `schedule (acme).task: required`},
		{func(s *Schedule) { s.Timezone = "Local" }, `schedule (acme).timezone: "Local" is not allowed; name a zone such as UTC`},
		{func(s *Schedule) { s.Timezone = "Mars/Base" }, `schedule (acme).timezone: unknown time zone "Mars/Base"`},
		{func(s *Schedule) { s.Payload = json.RawMessage(`[1, 2]`) }, `schedule (acme).payload: must be a mapping (JSON object), got a list`},
		{func(s *Schedule) { s.Payload = json.RawMessage(`{x`) }, `schedule (acme).payload: must be a mapping (JSON object), got invalid JSON`},
		{func(s *Schedule) { s.CatchUp = "sometimes" }, `schedule (acme).catch_up: must be skip, once or all, got "sometimes"`},
		{func(s *Schedule) { s.MaxRetry = -1 }, `schedule (acme).max_retry: must be at least 0, got -1`},
	} {
		s := ok
		tc.edit(&s)
		err := CheckSchedule(&s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSchedule = %v, want %q", err, tc.want)
		}
	}
}
