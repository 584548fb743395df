package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// burstSpec fires every 10s: each tick is a burst of every schedule due in
// the same second, as minute zero is, without waiting a minute per iteration.
const burstSpec = "*/10 * * * * *"

// burstWait bounds the wait for one burst's enqueues.
const burstWait = 15 * time.Second

// BenchmarkBurst10k: 10,000 schedules due in the same second on 3 replicas
// and one Redis, beside the baseline of asynq enqueuing the same 10,000
// tasks (with task ids) from one process and no claims, 20 enqueuers, one
// round trip each (asynq's client has no batch enqueue); and, for
// comparison, the same enqueues pipelined as a replica sends them. Reported
// per burst: p50/p99/max lateness (enqueue time − scheduled time), and Redis CPU per
// tick (INFO's used_cpu_user + used_cpu_sys over the measured bursts). Every
// tick must be enqueued exactly once. One iteration is one burst (10s).
//
//	go test -run '^$' -bench Burst10k -benchtime 2x ./internal/scheduler
func BenchmarkBurst10k(b *testing.B) { benchBurst(b, 10_000) }

func benchBurst(b *testing.B, n int) {
	spec, _ := ParseSpec(burstSpec, nil)
	b.Run("lockstep_3_replicas", func(b *testing.B) {
		srv := redistest.Start(b)
		c := testConfig(2*time.Second, 5*time.Second, numberedScheds(n, "burst-%05d", burstSpec)...) // the default max_clock_skew
		bl := newBursts()
		hook := func(e event) {
			bl.result(e.Result, e.Count)
			switch e.Result {
			case ResultEnqueued, ResultCaughtUp:
				bl.add(e.Schedule, e.Tick, e.Lateness)
			case ResultDuplicate:
				bl.dup()
			}
		}
		for i := range 3 {
			benchReplica(b, srv, c, i, hook)
		}
		bl.run(b, srv, spec, n)
	})
	// Every schedule with overlap skip and no worker: the first burst's
	// tasks stay queued, so each later tick is checked (the schedule's runs,
	// asynq's state of the queued run, tick.lua) and skipped. Lateness is
	// the time of the skip's record.
	b.Run("lockstep_3_replicas_overlap_skip", func(b *testing.B) {
		srv := redistest.Start(b)
		scheds := numberedScheds(n, "burst-%05d", burstSpec)
		for i := range scheds {
			scheds[i].Overlap = config.OverlapSkip
		}
		c := testConfig(2*time.Second, 5*time.Second, scheds...)
		bl := newBursts()
		hook := func(e event) {
			bl.result(e.Result, e.Count)
			switch e.Result {
			case ResultEnqueued, ResultCaughtUp:
				bl.add(e.Schedule, e.Tick, e.Lateness)
			case ResultSkippedOverlap:
				bl.add(e.Schedule, e.Tick, time.Since(e.Tick))
			case ResultDuplicate:
				bl.dup()
			}
		}
		for i := range 3 {
			benchReplica(b, srv, c, i, hook)
		}
		bl.run(b, srv, spec, n)
	})
	b.Run("asynq_enqueue_only", func(b *testing.B) {
		srv := redistest.Start(b)
		// As many enqueuers as a replica's loops keep busy: the pool size.
		asynqBursts(b, srv, asynq.NewClientFromRedisClient(srv.Client()), spec, n, 20)
	})
	// Not a baseline of the target: asynq's enqueue alone, pipelined the way
	// a replica pipelines it (enqueueClient, one goroutine per task), to
	// show how much of the gap to asynq_enqueue_only is round trips.
	b.Run("asynq_enqueue_pipelined", func(b *testing.B) {
		srv := redistest.Start(b)
		r := newRunner(srv.Client())
		stopRunner := make(chan struct{})
		var rw sync.WaitGroup
		rw.Go(func() { r.loop(stopRunner) })
		b.Cleanup(func() { close(stopRunner); rw.Wait() })
		asynqBursts(b, srv, asynq.NewClientFromRedisClient(r.enqueueClient()), spec, n, n)
	})
}

// asynqBursts enqueues n tasks with task ids at every tick of spec from
// enqueuers goroutines, with asynq's client alone, and measures them as
// benchBurst measures a scheduler.
func asynqBursts(b *testing.B, srv *redistest.Server, client *asynq.Client, spec Spec, n, enqueuers int) {
	bl := newBursts()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		everyTick(ctx, spec, func(t time.Time) {
			jobs := make(chan int)
			var ew sync.WaitGroup
			for range enqueuers {
				ew.Go(func() {
					for i := range jobs {
						name := fmt.Sprintf("plain-%05d", i)
						_, err := client.EnqueueContext(ctx, asynq.NewTask("test:tick", []byte(`{"n":1}`)),
							asynq.TaskID(TaskID(name, t)), asynq.Retention(time.Hour))
						if err == nil {
							bl.add(name, t, time.Since(t))
						}
					}
				})
			}
			for i := range n {
				jobs <- i
			}
			close(jobs)
			ew.Wait()
		})
	})
	bl.run(b, srv, spec, n)
}

// everyTick calls f at each tick of spec, in turn, until ctx ends.
func everyTick(ctx context.Context, spec Spec, f func(tick time.Time)) {
	for t := spec.Next(time.Now()); ; t = spec.Next(t) {
		tm := time.NewTimer(time.Until(t))
		select {
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C:
		}
		f(t)
	}
}

// benchReplica starts replica bench-i with hook on its events.
func benchReplica(b *testing.B, srv *redistest.Server, c *config.SchedulerConfig, i int, hook func(event)) *Scheduler {
	return replica(b, srv, c, nil, fmt.Sprint("bench-", i), withHooks(hooks{event: hook}))
}

// bursts collects per-tick lateness and checks each (schedule, tick) once.
// One iteration of a benchmark that uses it is one tick of its schedules.
type bursts struct {
	mu      sync.Mutex
	seen    map[string]int
	perTick map[int64]int
	samples []time.Duration
	dups    int
	results map[string]int
	changed chan struct{}
}

func (bl *bursts) result(r string, n int) {
	bl.mu.Lock()
	bl.results[r] += max(n, 1)
	bl.mu.Unlock()
}

func newBursts() *bursts {
	return &bursts{seen: map[string]int{}, perTick: map[int64]int{}, results: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (bl *bursts) add(schedule string, tick time.Time, late time.Duration) {
	bl.mu.Lock()
	bl.seen[schedule+":"+strconv.FormatInt(tick.Unix(), 10)]++
	bl.perTick[tick.Unix()]++
	bl.samples = append(bl.samples, late)
	bl.mu.Unlock()
	select {
	case bl.changed <- struct{}{}:
	default:
	}
}

func (bl *bursts) dup() {
	bl.mu.Lock()
	bl.dups++
	bl.mu.Unlock()
}

// wait returns once n schedules enqueued tick, and fails after timeout.
func (bl *bursts) wait(b *testing.B, tick time.Time, n int, timeout time.Duration) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		bl.mu.Lock()
		got := bl.perTick[tick.Unix()]
		bl.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-bl.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			bl.mu.Lock()
			results := maps.Clone(bl.results)
			bl.mu.Unlock() // the replicas' hooks take it until they stop
			b.Fatalf("tick %v: %d of %d schedules enqueued within %v (results so far: %v)", tick, got, n, timeout, results)
		}
	}
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec float64 }

func commandStats(b *testing.B, c redis.UniversalClient) map[string]cmdStat {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || name == line {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = f
			case "usec":
				st.usec = f
			}
		}
		out[name] = st
	}
	return out
}

// logCommandStats logs what Redis executed per tick between two
// commandstats: calls and execution time by command (a script's time
// includes the commands it calls, which are listed too; reading and
// writing the sockets is in INFO cpu only).
func logCommandStats(b *testing.B, before, after map[string]cmdStat, ticks int) {
	type row struct {
		name string
		cmdStat
	}
	var rows []row
	for name, a := range after {
		d := cmdStat{a.calls - before[name].calls, a.usec - before[name].usec}
		if d.calls > 0 && name != "info" {
			rows = append(rows, row{name, d})
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return cmp.Compare(y.usec, x.usec) })
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, " %s %.3g calls %.2gus;", r.name, r.calls/float64(ticks), r.usec/float64(ticks))
	}
	b.Logf("per tick:%s", sb.String())
}

// reset drops the samples so far (the warm-up's).
func (bl *bursts) reset() {
	bl.mu.Lock()
	bl.samples = bl.samples[:0]
	bl.mu.Unlock()
}

// sorted returns the samples so far, sorted.
func (bl *bursts) sorted() []time.Duration {
	bl.mu.Lock()
	s := slices.Clone(bl.samples)
	bl.mu.Unlock()
	slices.Sort(s)
	return s
}

// report reports p50, p99 and max lateness and samples per iteration, and
// returns the samples, sorted.
func (bl *bursts) report(b *testing.B) []time.Duration {
	s := bl.sorted()
	if len(s) == 0 {
		b.Fatal("no samples")
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(s[len(s)/2]), "p50-ms")
	b.ReportMetric(ms(s[(len(s)-1)*99/100]), "p99-ms")
	b.ReportMetric(ms(s[len(s)-1]), "max-ms")
	b.ReportMetric(float64(len(s))/float64(b.N), "ticks/op")
	return s
}

// runSeconds measures b.N ticks of n schedules due every second after one
// tick of warm-up.
func (bl *bursts) runSeconds(b *testing.B, n int) {
	spec, _ := ParseSpec("* * * * * *", nil)
	bl.wait(b, spec.Next(time.Now()), n, 5*time.Second) // warm up: connections, scripts loaded
	bl.reset()
	b.ResetTimer()
	tick := spec.Next(time.Now())
	for range b.N {
		bl.wait(b, tick, n, 5*time.Second)
		tick = spec.Next(tick)
	}
	b.StopTimer()
	bl.report(b)
}

// run measures b.N bursts after one warm-up burst.
func (bl *bursts) run(b *testing.B, srv *redistest.Server, spec Spec, n int) {
	// Warm up on the first burst that starts at least 3s from now (start-up, connections, scripts).
	warm := spec.Next(time.Now().Add(3 * time.Second))
	bl.wait(b, warm, n, burstWait)
	bl.reset()
	tick := spec.Next(time.Now().Add(time.Second)) // bursts in flight settle first
	time.Sleep(time.Until(tick.Add(-500 * time.Millisecond)))
	cpu0 := redistest.CPU(b, srv.Client())
	stats0 := commandStats(b, srv.Client())
	b.ResetTimer()
	for range b.N {
		bl.wait(b, tick, n, burstWait)
		tick = spec.Next(tick)
	}
	b.StopTimer()
	// Followers' claims come claimGrace after each burst; let them land.
	time.Sleep(claimGrace + 500*time.Millisecond)
	cpu := redistest.CPU(b, srv.Client()) - cpu0
	logCommandStats(b, stats0, commandStats(b, srv.Client()), b.N*n)

	bl.mu.Lock()
	dups := bl.dups
	for k, c := range bl.seen {
		if c != 1 {
			b.Errorf("%s enqueued %d times", k, c)
		}
	}
	bl.mu.Unlock()
	if dups > 0 {
		b.Errorf("%d duplicate enqueues", dups)
	}
	s := bl.report(b)
	b.ReportMetric(cpu.Seconds()*1e6/float64(len(s)), "redis-cpu-us/tick")
}

// BenchmarkKillAtBurst: 10,000 schedules due in the same second on 3
// replicas; just before each burst one replica dies as by SIGKILL (no clean
// leave) and a new one takes its place. Reported: the max lateness of the
// dead replica's share (its first-claimer schedules), which must be within
// tick_lock_ttl + 1s, beside the same burst with no kill. One iteration is
// one burst (10s).
//
//	go test -run '^$' -bench KillAtBurst -benchtime 2x ./internal/scheduler
func BenchmarkKillAtBurst(b *testing.B) {
	const n = 10_000
	spec, _ := ParseSpec(burstSpec, nil)
	for _, kill := range []bool{false, true} {
		name := map[bool]string{false: "no_kill", true: "kill_one_replica"}[kill]
		b.Run(name, func(b *testing.B) {
			srv := redistest.Start(b)
			scheds := numberedScheds(n, "burst-%05d", burstSpec)
			lease := 5 * time.Second
			c := testConfig(2*time.Second, lease, scheds...)
			bl := newBursts()
			var mu sync.Mutex
			var share map[string]bool
			var shareMax time.Duration
			hook := func(e event) {
				bl.result(e.Result, e.Count)
				if e.Result != ResultEnqueued && e.Result != ResultCaughtUp {
					return
				}
				bl.add(e.Schedule, e.Tick, e.Lateness)
				mu.Lock()
				if share[e.Schedule] {
					shareMax = max(shareMax, e.Lateness)
				}
				mu.Unlock()
			}
			var reps []*Scheduler
			for i := range 3 {
				reps = append(reps, benchReplica(b, srv, c, i, hook))
			}
			tick := spec.Next(time.Now().Add(3 * time.Second))
			bl.wait(b, tick, n, burstWait) // warm up
			var worst time.Duration
			b.ResetTimer()
			for i := range b.N {
				tick = spec.Next(tick)
				time.Sleep(time.Until(tick.Add(-100 * time.Millisecond)))
				if kill {
					dead := reps[0]
					owned := map[string]bool{}
					for _, s := range scheds {
						if dead.first(s.Name) {
							owned[s.Name] = true
						}
					}
					mu.Lock()
					share, shareMax = owned, 0
					mu.Unlock()
					dead.crash()
					reps = append(reps[1:], benchReplica(b, srv, c, 3+i, hook))
				}
				bl.wait(b, tick, n, burstWait)
				mu.Lock()
				worst = max(worst, shareMax)
				mu.Unlock()
			}
			b.StopTimer()
			s := bl.sorted()
			if kill {
				b.ReportMetric(float64(worst)/float64(time.Millisecond), "dead-share-max-ms")
				if worst > lease+time.Second {
					b.Errorf("the dead replica's share was enqueued %v late, want within tick_lock_ttl + 1s (%v)", worst, lease+time.Second)
				}
			}
			b.ReportMetric(float64(s[len(s)-1])/float64(time.Millisecond), "max-ms")
		})
	}
}
