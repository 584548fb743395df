// Package proctest is the one way the test helpers (redistest, etcdtest)
// run a server process: started so that it dies with the test binary even if
// cleanup never runs, signalled (SIGSTOP/SIGCONT for a pause), and killed and
// waited for. Its owner serializes the calls (it holds its own lock around
// them).
package proctest

import (
	"errors"
	"os/exec"
	"syscall"
)

// Proc is one run of a server process; the zero value is not running.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// Start runs bin with args. The process gets SIGKILL when the test binary
// dies (Pdeathsig), so no server outlives a crashed test.
func (p *Proc) Start(bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// Done is closed when the process started last exits (nil when none runs).
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process, e.g. SIGSTOP to pause it.
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.cmd == nil {
		return errors.New("not running")
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the exit; a paused process is continued
// first, so that it dies at once. It does nothing when none runs.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd, p.done = nil, nil
}
