package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/benchhold"
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func each(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

// spread is "median (min–max)".
func spread(xs []float64, format string) string {
	return fmt.Sprintf(format+" (%s–%s)", median(xs), fmt.Sprintf(format, slices.Min(xs)), fmt.Sprintf(format, slices.Max(xs)))
}

// ratio is the median over repetitions of a's rate over b's in the same one.
func ratio(a, b []sample) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		out = append(out, a[i].rate()/b[i].rate())
	}
	return out
}

func report(names []string, r map[string]map[string][]sample) {
	raw, bsm := names[0], names[1]
	fmt.Printf("\n### Uncontended acquire + release (each goroutine on its own key), medians of %d interleaved repetitions of %v (min–max)\n\n", *cycleReps, *cycleTime)
	fmt.Println("| peer | goroutines | cycles/s | vs raw | vs redislock | client cmds/cycle | round trips/cycle | server cmds/cycle | Redis CPU µs/cycle | client CPU µs/cycle |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, kind := range []string{"cycle/1", "cycle/64"} {
		g := strings.TrimPrefix(kind, "cycle/")
		for _, n := range names {
			ss := r[kind][n]
			if len(ss) == 0 {
				continue
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.1f | %.1f |\n", n, g,
				spread(each(ss, sample.rate), "%.0f"),
				spread(ratio(ss, r[kind][raw]), "%.2f×"),
				spread(ratio(ss, r[kind][bsm]), "%.2f×"),
				median(each(ss, func(s sample) float64 { return s.per(s.cmds) })),
				median(each(ss, func(s sample) float64 { return s.per(s.trips) })),
				median(each(ss, func(s sample) float64 { return s.per(s.serverCmds) })),
				median(each(ss, func(s sample) float64 { return float64(s.cpu.Microseconds()) / float64(max(s.ops, 1)) })),
				median(each(ss, func(s sample) float64 { return float64(s.self.Microseconds()) / float64(max(s.ops, 1)) })))
		}
	}
	cont := fmt.Sprintf("contended/%d", *contenders)
	fmt.Printf("\n### %d goroutines, one key, %v hold (%s), each waiting as its library does; medians of %d repetitions (min–max)\n\n", *contenders, *hold, benchhold.Mode(), *reps)
	fmt.Println("| peer | acquisitions/s | vs one goroutine alone | round trips/acq | wait p50 | wait p99 | acquisitions per goroutine (min–max, worst rep) | max/min | Redis CPU µs/acq | hold (mean) | release → next holder (p50) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
	for _, n := range names {
		ss := r[cont][n]
		if len(ss) == 0 {
			continue
		}
		worst := slices.MaxFunc(ss, func(a, b sample) int {
			fa, fb := float64(a.perMax)/float64(max(a.perMin, 1)), float64(b.perMax)/float64(max(b.perMin, 1))
			return cmpF(fa, fb)
		})
		fmt.Printf("| %s | %s | %s | %.2f | %s | %s | %d–%d | %s | %.1f | %s | %s |\n", n,
			spread(each(ss, sample.rate), "%.0f"),
			spread(ratio(ss, r["alone/1"][n]), "%.2f×"),
			median(each(ss, func(s sample) float64 { return s.per(s.trips) })),
			ms(median(each(ss, func(s sample) float64 { return float64(s.p50) }))),
			spread(each(ss, func(s sample) float64 { return float64(s.p99) / 1e6 }), "%.1f ms"),
			worst.perMin, worst.perMax,
			spread(each(ss, func(s sample) float64 { return float64(s.perMax) / float64(max(s.perMin, 1)) }), "%.2f"),
			median(each(ss, func(s sample) float64 { return float64(s.cpu.Microseconds()) / float64(max(s.ops, 1)) })),
			ms(median(each(ss, func(s sample) float64 { return float64(s.hold) }))),
			ms(median(each(ss, func(s sample) float64 { return float64(s.handoff) }))))
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func ms(ns float64) string { return fmt.Sprintf("%.2f ms", ns/1e6) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-peers:", err)
	os.Exit(1)
}

// startRedis starts a private redis-server (no persistence) on a free port.
func startRedis() (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		fail(fmt.Errorf("redis-server: %w (make deps installs it)", err))
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			stop()
			fail(fmt.Errorf("redis-server on %s did not answer", addr))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, stop
}

func redisVersion(s server) string {
	info, _ := s.admin.Info(context.Background(), "server").Result()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}
