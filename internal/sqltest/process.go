package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// process is a server process. proctest.Proc cannot run a process as another
// user, which PostgreSQL needs when the tests run as root; this is the same
// shape (SIGKILL when the test binary dies, output to a log, kill and wait)
// with a credential.
type process struct {
	what string
	// stop ends the server with its children: PostgreSQL's postmaster
	// takes its backends down on SIGQUIT, where SIGKILL would orphan them.
	stop syscall.Signal
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// runAs is the user a server runs as: nobody when the tests run as root
// (PostgreSQL refuses root), else nil, the tests' own user.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root, and no user nobody to run the server as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: false}, nil
}

// command returns bin with args, run in dir as cred, its output appended to
// log.
func command(bin string, args []string, dir, log string, cred *syscall.Credential) (*exec.Cmd, *os.File, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	// SIGKILL when the test binary dies, so no server outlives a crashed
	// test; the kernel applies it after the credential change.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	cmd.WaitDelay = time.Second
	return cmd, f, nil
}

// run runs a setup command (initdb, mariadb-install-db) to its end.
func run(what, bin string, args []string, dir, log string, cred *syscall.Credential) error {
	cmd, f, err := command(bin, args, dir, log, cred)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		err = errors.Join(ctx.Err(), <-done)
	}
	if err != nil {
		return fmt.Errorf("%s: %w; log:\n%s", what, err, tail(log, 3000))
	}
	return nil
}

// serve starts a server and waits until a connection to dsn answers a ping,
// or the server exits, or startTimeout passes.
func serve(what, bin string, args []string, dir, log string, cred *syscall.Credential, stop syscall.Signal, driver, dsn string) (*process, error) {
	cmd, f, err := command(bin, args, dir, log, cred)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	p := &process{what: what, stop: stop, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	if err := p.waitReady(driver, dsn); err != nil {
		p.kill()
		return nil, fmt.Errorf("%s: %w; log:\n%s", what, err, tail(log, 3000))
	}
	return p, nil
}

func (p *process) waitReady(driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err = db.PingContext(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited before it answered (last ping: %v)", err)
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %v", startTimeout, err)
		case <-time.After(pollEvery):
		}
	}
}

// kill sends the stop signal, and SIGKILL when the server has not exited a
// few seconds later, and waits for the exit.
func (p *process) kill() {
	if p.stop != 0 && p.stop != syscall.SIGKILL {
		_ = p.cmd.Process.Signal(p.stop)
		select {
		case <-p.done:
			return
		case <-time.After(5 * time.Second):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// binary finds prog on PATH or in dirs (globs), failing with an install hint.
func binary(prog, pkg string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(prog); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		matches, _ := filepath.Glob(filepath.Join(d, prog))
		if len(matches) > 0 {
			return matches[len(matches)-1], nil // the highest version
		}
	}
	return "", fmt.Errorf("%s is not installed. Install it with `apt-get update && apt-get install -y %s`, "+
		"or run `make test`, whose deps step does", prog, pkg)
}
