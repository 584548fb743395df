package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// The operator's page is `lockstep ui` (cmd/lockstep), which is a command of
// its own: a local run starts that binary, found next to this one (make run
// builds both into bin/run/), as a child on the run's Redis.

// page is a running `lockstep ui`.
type page struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startPage starts `lockstep ui --http-addr addr` on the Redis at redisAddr
// and waits until it answers. It returns nil, nil when there is no lockstep
// binary next to this one.
func startPage(ctx context.Context, addr, redisAddr, prefix string, stderr io.Writer) (*page, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", nil
	}
	bin := filepath.Join(filepath.Dir(self), "lockstep")
	if _, err := os.Stat(bin); err != nil {
		return nil, "", nil
	}
	ln, err := net.Listen("tcp", addr) // the port is free, or the error says why not
	if err != nil {
		return nil, "", fmt.Errorf("%w: --page-addr: %w", errConfig, err)
	}
	addr = ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(bin, "--prefix", prefix, "ui", "--http-addr", addr)
	cmd.Env = append(os.Environ(), "LOCKSTEP_REDIS_ADDR="+redisAddr)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	p := &page{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	url := "http://" + addr + "/"
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return p, url, nil
		}
		select {
		case <-p.done:
			return nil, "", errors.New("lockstep ui exited at start")
		case <-ctx.Done():
			p.stop()
			return nil, "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, "", fmt.Errorf("lockstep ui did not answer at %s: %w", url, err)
		}
	}
}

// stop ends the page: SIGTERM, then SIGKILL after a second.
func (p *page) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
