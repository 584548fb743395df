package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/fx"

	"github.com/lockstep-dev/lockstep/internal/role"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/worker"
)

const (
	// readyTimeout bounds how long a role may take to answer /readyz.
	readyTimeout = 20 * time.Second
	// schedulerStopTimeout bounds a replica's stop: ticks in flight finish
	// (the role's own stop timeout, and some slack).
	schedulerStopTimeout = 40 * time.Second
	// workerStopSlack is how much longer than worker.shutdown_timeout a
	// worker may take to stop before the run gives up on it.
	workerStopSlack = 15 * time.Second
	// bindTries is how often a role is started on another free port when
	// its port was taken between the probe and the bind.
	bindTries = 3
)

// runFunc is a role's entry point: scheduler.Run or worker.Env.Run, the
// same ones cmd/scheduler and cmd/worker call.
type runFunc func(ctx context.Context, env role.Env) error

// schedulerRun runs scheduler replica name: the real scheduler role, with
// its logs named after it, keeping its metrics registry in reg (the summary
// reads it, also after the replica stopped).
func schedulerRun(name string, reg *registry) runFunc {
	return func(ctx context.Context, env role.Env) error {
		return scheduler.Run(ctx, env,
			fx.Decorate(func(l *slog.Logger) *slog.Logger { return l.With("role", name) }),
			fx.Invoke(reg.set))
	}
}

// registry is a replica's metrics registry, once its app is assembled.
type registry struct {
	mu  sync.Mutex
	reg *prometheus.Registry
}

func (r *registry) set(reg *prometheus.Registry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reg = reg
}

func (r *registry) Gather() ([]*dto.MetricFamily, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reg == nil {
		return nil, errors.New("not started")
	}
	return r.reg.Gather()
}

func workerRun(ctx context.Context, env role.Env) error { return worker.Env(env).Run(ctx) }

// roleProc is one role's Run in a goroutine of its own.
type roleProc struct {
	name   string
	addr   string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, once done
}

func (w *roleProc) metricsURL() string { return "http://" + w.addr + "/metrics" }

// startRole runs a role with the configuration file at path and the run's
// variables, and waits until it answers /readyz. port 0 picks a free one.
func startRole(name string, run runFunc, path string, env func(string) (string, bool), stderr io.Writer,
	port int, hc *http.Client) (*roleProc, error) {
	for try := 1; ; try++ {
		addr, err := loopbackAddr(port)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		w := &roleProc{name: name, addr: addr, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(w.done)
			w.err = run(ctx, role.Env{Args: []string{"--config", path, "--http-addr", addr}, LookupEnv: env, Stderr: stderr})
		}()
		err = w.waitReady(hc)
		if err == nil {
			return w, nil
		}
		w.stop(0)
		if port == 0 && try < bindTries && errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
}

// waitReady polls /readyz until it answers 200, Run returns, or readyTimeout
// passes.
func (w *roleProc) waitReady(hc *http.Client) error {
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		if ready(hc, "http://"+w.addr+"/readyz") {
			return nil
		}
		select {
		case <-w.done:
			if w.err == nil {
				return errors.New("it ended before it was ready")
			}
			return w.err
		case <-deadline.C:
			return fmt.Errorf("not ready at http://%s/readyz within %v", w.addr, readyTimeout)
		case <-poll.C:
		}
	}
}

func ready(hc *http.Client, url string) bool {
	resp, err := hc.Get(url)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop ends the role as a signal would: a scheduler stops ticking (ticks in
// flight finish), a worker stops taking tasks and lets running handlers
// finish. It waits at most timeout; 0 waits for as long as it takes.
func (w *roleProc) stop(timeout time.Duration) error {
	w.cancel()
	if timeout == 0 {
		<-w.done
		return w.err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
		if w.err != nil {
			return fmt.Errorf("%s: %w", w.name, w.err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("%s: did not stop within %v", w.name, timeout)
	}
}

// loopbackAddr is 127.0.0.1:port, or a free port when port is 0. A free port
// can be taken by someone else before the role binds it; startRole then
// tries another.
func loopbackAddr(port int) (string, error) {
	if port != 0 {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}
