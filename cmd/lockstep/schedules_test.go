package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// schedCLI runs one subcommand against srv, with the config file at path.
type schedCLI struct {
	t    *testing.T
	srv  *redistest.Server
	path string
}

func newCLI(t *testing.T) *schedCLI {
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	body := fmt.Sprintf("redis:\n  addr: %q\nschedules:\n  - {name: nightly, cron: '0 0 2 * * *', task: report:nightly}\n", srv.Addr)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return &schedCLI{t: t, srv: srv, path: path}
}

func (c *schedCLI) run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), configPath: c.path, client: c.srv.Client(), prefix: "lockstep:"}
	switch args[0] {
	case "schedules":
		code = cmdSchedules(c.t.Context(), a, args[1:])
	case "ticks":
		code = cmdTicks(c.t.Context(), a, args[1:])
	}
	return code, out.String(), errb.String()
}

func (c *schedCLI) expect(want int, args ...string) string {
	c.t.Helper()
	code, out, errs := c.run(args...)
	if code != want {
		c.t.Fatalf("lockstep %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errs)
	}
	return out + errs
}

func (c *schedCLI) list() []map[string]any {
	c.t.Helper()
	var got []map[string]any
	if err := json.Unmarshal([]byte(c.expect(0, "schedules", "--json")), &got); err != nil {
		c.t.Fatal(err)
	}
	return got
}

func TestSchedulesCommands(t *testing.T) {
	t.Parallel()
	c := newCLI(t)

	// A bad schedule: exit 2 naming the field, nothing stored.
	out := c.expect(2, "schedules", "add", "bad", "--cron", "61 * * * *", "--task", "t", "--payload", "[1]")
	for _, want := range []string{`schedule (bad).cron: invalid cron expression "61 * * * *"`, "schedule (bad).payload: must be a mapping (JSON object), got a list"} {
		if !strings.Contains(out, want) {
			t.Errorf("bad add: %q, want %q", out, want)
		}
	}
	c.expect(2, "schedules", "add", "--task", "t")                                // no NAME
	c.expect(2, "schedules", "add", "x", "--cron")                                // flag without value
	c.expect(2, "schedules", "frobnicate")                                        // unknown subcommand
	c.expect(2, "schedules", "add", "nightly", "--cron", "@daily", "--task", "t") // a file schedule's name
	if out := c.expect(2, "schedules", "add", "x", "--cron", "@daily", "--task", "t", "--overlap", "queue"); !strings.Contains(out,
		`schedule (x).overlap: must be allow, skip, buffer_one or cancel_previous, got "queue"`) {
		t.Errorf("bad --overlap: %q", out)
	}
	if help := c.expect(0, "schedules", "add", "--help"); !strings.Contains(help, "--cron") && !strings.Contains(help, "-cron") {
		t.Errorf("--help: %q", help)
	}
	if got := c.list(); len(got) != 1 || got[0]["name"] != "nightly" || got[0]["source"] != "file" {
		t.Fatalf("list after a refused add: %v", got)
	}

	// Add, list with the exact JSON fields.
	c.expect(0, "schedules", "add", "acme", "--cron", "0 */5 * * * *", "--task", "report:build", "--payload", `{"customer":"acme"}`, "--timezone", "Europe/Berlin", "--queue", "reports")
	c.expect(1, "schedules", "add", "acme", "--cron", "@hourly", "--task", "report:build")
	c.expect(0, "schedules", "add", "acme", "--cron", "0 */10 * * * *", "--task", "report:build", "--timezone", "Europe/Berlin", "--overlap", "buffer_one", "--update")
	got := c.list()
	if len(got) != 2 {
		t.Fatalf("list: %v", got)
	}
	acme := got[0]
	keys := make([]string, 0, len(acme))
	for k := range acme {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"cron", "last_tick", "name", "next_tick", "overlap", "paused", "source", "task", "timezone"}; !slices.Equal(keys, want) {
		t.Errorf("JSON fields %v, want %v", keys, want)
	}
	if acme["overlap"] != "buffer_one" || got[1]["overlap"] != "allow" {
		t.Errorf("overlap: %v and %v, want buffer_one and allow (the default)", acme["overlap"], got[1]["overlap"])
	}
	if acme["name"] != "acme" || acme["cron"] != "0 */10 * * * *" || acme["timezone"] != "Europe/Berlin" || acme["source"] != "runtime" ||
		acme["paused"] != false || acme["next_tick"] == nil || acme["last_tick"] != nil {
		t.Errorf("acme: %v", acme)
	}

	// Pause, resume, for run-time and file schedules alike.
	c.expect(0, "schedules", "pause", "acme")
	c.expect(1, "schedules", "pause", "acme") // nothing to do
	c.expect(0, "schedules", "pause", "nightly")
	for _, s := range c.list() {
		if s["paused"] != true || s["next_tick"] != nil {
			t.Errorf("paused: %v", s)
		}
	}
	c.expect(0, "schedules", "resume", "nightly")
	c.expect(1, "schedules", "pause", "nope")
	if table := c.expect(0, "schedules"); !strings.Contains(table, "NAME") || !strings.Contains(table, "acme") {
		t.Errorf("table: %q", table)
	}

	// Trigger: a task with its own id, then shown by ticks.
	out = c.expect(0, "schedules", "trigger", "acme")
	if !strings.Contains(out, "task acme:trigger:") {
		t.Errorf("trigger: %q", out)
	}
	c.expect(0, "schedules", "trigger", "nightly")
	c.expect(1, "schedules", "trigger", "nope")
	var ticks []map[string]any
	if err := json.Unmarshal([]byte(c.expect(0, "ticks", "acme", "--json", "--last", "5")), &ticks); err != nil {
		t.Fatal(err)
	}
	if len(ticks) != 1 || ticks[0]["state"] != "done" || ticks[0]["leader"] != "trigger" || !strings.HasPrefix(ticks[0]["task_id"].(string), "acme:trigger:") {
		t.Errorf("ticks: %v", ticks)
	}
	c.expect(1, "ticks", "nope")
	c.expect(2, "ticks")
	c.expect(2, "ticks", "acme", "--last", "0")
	c.expect(0, "ticks", "--help")

	// Remove.
	c.expect(2, "schedules", "rm", "nightly") // a file schedule
	c.expect(0, "schedules", "rm", "acme")
	c.expect(1, "schedules", "rm", "acme")
	if got := c.list(); len(got) != 1 {
		t.Errorf("after rm: %v", got)
	}
}
