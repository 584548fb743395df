// Package proctest is the one way tests run a process, a server of the test
// helpers (redistest, etcdtest, deploytest's Prometheus) or a command under
// test (Build, Main, Start): found on PATH with an install hint, started so
// that it dies with the test binary even if cleanup never runs, waited for
// until it serves, paused (SIGSTOP) and resumed (SIGCONT), killed and
// restarted, or stopped gracefully. A failed start quotes the tail of the
// process's log.
//
// A helper embeds *Proc in its own server type, so that Kill, Pause, Resume
// and Restart are the same methods on every kind of server.
package proctest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Spec describes one server process.
type Spec struct {
	What string // names it in failures, e.g. "redis-server 127.0.0.1:6380"
	Bin  string
	Args []string
	// Log is the process's log file. Its standard output and error are
	// appended to it, and its tail is quoted when a start fails.
	Log string
	// Ready, when set, waits until a freshly started process serves, or
	// returns an error; exited is closed if the process dies first. Without
	// it a start returns as soon as the process runs.
	Ready func(exited <-chan struct{}) error
	// Env is the process's whole environment; nil inherits the test's.
	Env []string
	// Output, when set, also receives the process's standard output and
	// error, e.g. a *Log to wait on.
	Output io.Writer
}

// Proc is one server process owned by a test; its methods are safe to call
// from several goroutines. The zero value is not usable: see New.
type Proc struct {
	tb   testing.TB
	spec Spec

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// New returns a process for spec, not started yet.
func New(tb testing.TB, spec Spec) *Proc { return &Proc{tb: tb, spec: spec} }

// Start is New and Start for a process the test owns to its end, a
// command under test, say: it fails tb when the start fails, and when the
// test ends kills the process and, if the test failed, logs the process's
// last lines (from spec.Output when that is a *Log, else from spec.Log).
func Start(tb testing.TB, spec Spec) *Proc {
	tb.Helper()
	p := New(tb, spec)
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	pid := p.Pid()
	tb.Cleanup(func() {
		p.Kill()
		if !tb.Failed() {
			return
		}
		tail := p.LogTail(4096)
		if l, ok := spec.Output.(*Log); ok {
			tail = l.Tail(40)
		}
		tb.Logf("last lines of %s %d:\n%s", spec.What, pid, tail)
	})
	return p
}

// Start runs the process and waits for Ready. On failure the process is
// killed and the error quotes the tail of its log. It fails while the
// process runs (Restart replaces a running process).
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.spec.What)
	}
	return p.startLocked()
}

func (p *Proc) startLocked() error {
	cmd := exec.Command(p.spec.Bin, p.spec.Args...)
	// SIGKILL when the test binary dies, so no server outlives a crashed test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = p.spec.Env
	var outs []io.Writer
	if p.spec.Log != "" {
		f, err := os.OpenFile(p.spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer f.Close() // the child has its own descriptor
		outs = append(outs, f)
	}
	if p.spec.Output != nil {
		outs = append(outs, p.spec.Output)
	}
	// Once the process exits, a child of it that still holds its output
	// must not hold up Wait (and so Kill) for long.
	cmd.WaitDelay = time.Second
	switch len(outs) {
	case 1:
		cmd.Stdout, cmd.Stderr = outs[0], outs[0]
	case 2:
		out := io.MultiWriter(outs...)
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	if p.spec.Ready == nil {
		return nil
	}
	if err := p.spec.Ready(done); err != nil {
		p.killLocked()
		return fmt.Errorf("%s: %w; log:\n%s", p.spec.What, err, p.LogTail(3000))
	}
	return nil
}

// Restart kills the process (if running) and starts it again with the same
// arguments, failing the test if it does not come back. Its ports are its
// own, so only a lingering socket can delay the bind: it retries for a
// second.
func (p *Proc) Restart() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	var err error
	for range 50 {
		if err = p.startLocked(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.tb.Fatalf("proctest: restart %s: %v", p.spec.What, err)
}

// Exited is closed when the process started last exits (nil when none runs).
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Pause stops the process with SIGSTOP: connections stay open, nothing answers.
func (p *Proc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig syscall.Signal) {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	err := errors.New("not running")
	if p.cmd != nil {
		err = p.cmd.Process.Signal(sig)
	}
	if err != nil {
		p.tb.Fatalf("proctest: signal %v to %s: %v", sig, p.spec.What, err)
	}
}

// Kill sends SIGKILL and waits for the exit; a paused process is continued
// first, so that it dies at once. It does nothing when none runs.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *Proc) killLocked() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd, p.done = nil, nil
}

// Stop sends SIGTERM and waits for the exit, killing the process when it
// has not exited within timeout. It reports whether the process exited by
// itself (true too when none runs).
func (p *Proc) Stop(timeout time.Duration) bool {
	_, ok := p.Term(timeout)
	return ok
}

// Term is Stop that also returns the exit code of a process that exited by
// itself (0 when none runs, -1 when it was killed).
func (p *Proc) Term(timeout time.Duration) (code int, exited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0, true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.waitLocked(timeout)
}

// Wait waits up to timeout for the process to exit by itself and returns its
// exit code; exited is false (and the process killed) when it did not.
func (p *Proc) Wait(timeout time.Duration) (code int, exited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0, true
	}
	return p.waitLocked(timeout)
}

func (p *Proc) waitLocked(timeout time.Duration) (int, bool) {
	select {
	case <-p.done:
		code := p.cmd.ProcessState.ExitCode()
		p.cmd, p.done = nil, nil
		return code, true
	case <-time.After(timeout):
		p.killLocked()
		return -1, false
	}
}

// Pid is the running process's id, 0 when none runs.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// LogTail returns the last n bytes of the process's log.
func (p *Proc) LogTail(n int) string {
	b, _ := os.ReadFile(p.spec.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Binary returns the path of prog, failing the test with an install hint
// when it is not installed: pkg is what `apt-get install -y` needs.
func Binary(tb testing.TB, prog, pkg string) string {
	tb.Helper()
	bin, err := exec.LookPath(prog)
	if err != nil {
		tb.Fatalf("%s is not installed (%v). Install it with "+
			"`apt-get update && apt-get install -y %s`, or run `make test`, which does.", prog, err, pkg)
	}
	return bin
}

// FreePort returns a loopback port that was free a moment ago. Another
// process can take it before the caller binds it: callers retry.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WriteFile writes content to a file name in a directory of the test's own
// (tb.TempDir) and returns its path: a process's configuration, say.
func WriteFile(tb testing.TB, name, content string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}
