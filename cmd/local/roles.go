package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/worker"
)

const (
	// readyTimeout bounds how long a worker may take to answer /readyz.
	readyTimeout = 20 * time.Second
	// schedulerStopTimeout bounds a replica's stop: ticks in flight finish.
	schedulerStopTimeout = 10 * time.Second
	// workerStopSlack is how much longer than worker.shutdown_timeout a
	// worker may take to stop before the run gives up on it.
	workerStopSlack = 15 * time.Second
	// bindTries is how often a worker is started on another free port when
	// its port was taken between the probe and the bind.
	bindTries = 3
)

// replica is one scheduler replica with its own Redis client, metrics
// registry and /metrics server.
type replica struct {
	name   string
	client redis.UniversalClient
	sched  *scheduler.Scheduler
	reg    *prometheus.Registry
	srv    *metrics.Server
}

// newReplica builds replica name on cfg, serving HTTP at addr; it starts
// nothing.
func newReplica(name string, cfg *config.SchedulerConfig, addr string, log *slog.Logger) (*replica, error) {
	opts, err := cfg.Redis.UniversalOptions()
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true // a tick's deadline bounds its Redis calls
	client := redis.NewUniversalClient(opts)
	reg := metrics.NewRegistry()
	log = log.With("role", name)
	// The id must differ between replicas, also between two local runs on
	// one real Redis: it makes the claim tokens.
	s, err := scheduler.New(client, cfg,
		scheduler.WithReplicaID(name+"-"+strconv.Itoa(os.Getpid())+"-"+randomHex(3)),
		scheduler.WithMetrics(metrics.New(reg)),
		scheduler.WithLogger(log))
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	srv := metrics.NewServer(addr, reg, map[string]func(context.Context) error{
		"redis":     func(ctx context.Context) error { return client.Ping(ctx).Err() },
		"scheduler": s.Ready,
	}, log)
	return &replica{name: name, client: client, sched: s, reg: reg, srv: srv}, nil
}

func (r *replica) start(ctx context.Context) error {
	if err := r.srv.Start(ctx); err != nil {
		return fmt.Errorf("%s: %w", r.name, err)
	}
	return r.sched.Start(ctx)
}

// stop stops ticking; ticks in flight finish.
func (r *replica) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), schedulerStopTimeout)
	defer cancel()
	if err := r.sched.Stop(ctx); err != nil {
		return fmt.Errorf("%s: stop: %w", r.name, err)
	}
	return nil
}

// close ends the HTTP server and the Redis client, after stop.
func (r *replica) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(r.srv.Stop(ctx), r.client.Close())
}

func (r *replica) metricsURL() string { return "http://" + r.srv.Addr() + "/metrics" }

// workerRole is one worker.Run in a goroutine of its own.
type workerRole struct {
	name   string
	addr   string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, once done
}

func (w *workerRole) metricsURL() string { return "http://" + w.addr + "/metrics" }

// startWorker runs a worker with the configuration file at path and waits
// until it answers /readyz. port 0 picks a free one.
func startWorker(name, path string, port int, hc *http.Client) (*workerRole, error) {
	for try := 1; ; try++ {
		addr, err := loopbackAddr(port)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		w := &workerRole{name: name, addr: addr, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(w.done)
			w.err = worker.Run(ctx, []string{"--config", path, "--http-addr", addr})
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
func (w *workerRole) waitReady(hc *http.Client) error {
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
				return errors.New("worker ended before it was ready")
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

// stop ends the worker: it stops taking tasks and lets running handlers
// finish (worker.shutdown_timeout). It waits at most shutdown + slack; 0
// waits for as long as it takes.
func (w *workerRole) stop(shutdown time.Duration) error {
	w.cancel()
	if shutdown == 0 {
		<-w.done
		return w.err
	}
	t := time.NewTimer(shutdown + workerStopSlack)
	defer t.Stop()
	select {
	case <-w.done:
		if w.err != nil {
			return fmt.Errorf("%s: %w", w.name, w.err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("%s: did not stop within %v", w.name, shutdown+workerStopSlack)
	}
}

// loopbackAddr is 127.0.0.1:port, or a free port when port is 0. A free port
// can be taken by someone else before the worker binds it; startWorker then
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

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
