package proctest

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// Log records a process's output line by line, so that a test can wait for
// one of its JSON log records (an event the process announces) instead of
// sleeping. It is an io.Writer: pass it as Spec.Output.
type Log struct {
	mu      sync.Mutex
	lines   []string
	partial []byte
	changed chan struct{} // closed and replaced when a line is added
}

// Write adds the complete lines in b (a line's end may come in a later Write).
func (l *Log) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	added := false
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		added = true
	}
	if added && l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return len(b), nil
}

// Len is how many lines were logged so far: a start for Wait.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// String is everything logged so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// Tail is the last n lines logged so far.
func (l *Log) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-n):], "\n")
}

// Wait waits for a JSON record, on line from or later, that match accepts,
// and returns it. It fails tb, quoting the output, when timeout passes first
// or when exited closes first (the process ended; nil: not watched); what
// names the record in that message.
func (l *Log) Wait(tb testing.TB, from int, timeout time.Duration, exited <-chan struct{}, what string, match func(map[string]any) bool) map[string]any {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	ended := false
	for seen := from; ; {
		l.mu.Lock()
		lines := l.lines[min(seen, len(l.lines)):]
		seen = len(l.lines)
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		l.mu.Unlock()
		for _, line := range lines {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && match(rec) {
				return rec
			}
		}
		if ended { // every line is in: the process's output is copied before it counts as exited
			tb.Fatalf("the process exited before logging %s; output:\n%s", what, l.String())
		}
		select {
		case <-changed:
		case <-exited:
			ended, exited = true, nil // look once more at what came meanwhile
		case <-deadline.C:
			tb.Fatalf("no log of %s within %v; output:\n%s", what, timeout, l.String())
		}
	}
}

// Find returns the first JSON record logged so far that match accepts, or
// nil: for a test that polls several processes for one event.
func (l *Log) Find(match func(map[string]any) bool) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && match(rec) {
			return rec
		}
	}
	return nil
}

// Msg matches a record whose msg is msg and whose other fields have the
// given values ("key", value, ...).
func Msg(msg string, fields ...any) func(map[string]any) bool {
	return func(rec map[string]any) bool {
		if rec["msg"] != msg {
			return false
		}
		for i := 0; i+1 < len(fields); i += 2 {
			if rec[fields[i].(string)] != fields[i+1] {
				return false
			}
		}
		return true
	}
}
