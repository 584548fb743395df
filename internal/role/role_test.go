package role

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestExitCode(t *testing.T) {
	t.Parallel()
	joined := ConfigError(errors.Join(errors.New("a.yaml: line 2: x: bad"), errors.New("a.yaml: y: bad")))
	for _, c := range []struct {
		err  error
		code int
		line string // what stderr says
	}{
		{nil, 0, ""},
		{ErrHelp, 0, ""},
		{joined, 2, "a.yaml: line 2: x: bad (and 1 more problem)\n"},
		{errors.New("listen tcp:  address\tin use"), 1, "r: listen tcp: address in use\n"},
		{errors.Join(errors.New("start: busy"), errors.New("stop: timeout"), errors.New("close")), 1, "r: start: busy (and 2 more problems)\n"},
	} {
		var out strings.Builder
		if got := ExitCode("r", c.err, &out); got != c.code {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.code)
		}
		if out.String() != c.line {
			t.Errorf("ExitCode(%v) wrote %q, want %q", c.err, out.String(), c.line)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none.yaml")
	var usage strings.Builder
	if _, err := Parse("worker", missing, true, Env{Args: []string{"--help"}, Stderr: &usage}); !errors.Is(err, ErrHelp) {
		t.Fatalf("--help: %v, want ErrHelp", err)
	}
	for _, w := range []string{"Usage: worker [--config FILE] [--http-addr HOST:PORT]", "-config", "-http-addr"} {
		if !strings.Contains(usage.String(), w) {
			t.Errorf("usage %q does not contain %q", usage.String(), w)
		}
	}
	f, err := Parse("worker", missing, true, Env{Args: []string{"--http-addr", "127.0.0.1:0"}})
	if err != nil || f.Config != "" || f.HTTPAddr != "127.0.0.1:0" {
		t.Errorf("optional missing default: %+v, %v; want no file and the address", f, err)
	}
	if f, err := Parse("scheduler", missing, false, Env{}); err != nil || f.Config != missing {
		t.Errorf("required default: %+v, %v; want the default path", f, err)
	}
	for name, args := range map[string][]string{
		"unknown flag":   {"--nope"},
		"extra argument": {"extra"},
		"bad address":    {"--http-addr", "localhost"},
		"bad port":       {"--http-addr", "localhost:http"},
	} {
		_, err := Parse("worker", missing, true, Env{Args: args})
		if !errors.Is(err, ErrConfig) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line matching ErrConfig", name, err)
		}
	}
}

// A role whose Redis does not answer at start waits for it until the start's
// deadline, then fails naming it (the worker and the scheduler alike exit 1);
// a Redis that comes up meanwhile lets it start.
func TestWaitForRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := WaitForRedis(c, "addr="+srv.Addr)(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis (addr="+srv.Addr+") does not answer") {
		t.Fatalf("WaitForRedis with Redis down: %v, want an error naming it", err)
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- WaitForRedis(c, srv.Addr)(ctx)
	}()
	srv.Restart()
	if err := redistest.Receive(t, done, 30*time.Second, "WaitForRedis to return once Redis is back"); err != nil {
		t.Fatalf("WaitForRedis after Redis came back: %v", err)
	}
}
