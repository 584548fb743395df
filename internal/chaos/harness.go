package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/etcdtest"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/procid"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

// Config is one run's shape.
type Config struct {
	// Duration of traffic and faults; the last sixth (at least 10s) is quiet,
	// so that every fault's recovery is seen.
	Duration time.Duration
	Seed     uint64
	// Out is the folder for the reports and the processes' logs.
	Out string
	// Faults are the kinds drawn from (default AllFaults), each once per
	// round in an order the seed shuffles.
	Faults []string
	// Progress receives the live line; nil for none.
	Progress io.Writer
	// Lock is the workers' lock back end: "redis" (default) or "etcd" (a
	// 3-member etcd cluster holds the locks; the queue stays on Redis, and
	// the etcd faults join the schedule).
	Lock string
	// Store is the demo's fenced store: "redis" (default) or "postgres" (a
	// private PostgreSQL from internal/sqltest, whose log table the checker
	// reads back; the executions stream stays in Redis).
	Store string
	// Redis is where the queue and the Redis locks live: "single" (default,
	// one AOF server) or "cluster" (a private Redis Cluster of 3 masters with
	// a replica each; the workers and the schedulers in redis.mode cluster,
	// and the Cluster's faults, ClusterFaults, drawn instead of the single
	// server's and worker_blackhole).
	Redis string
}

// The run's fixed shape: 3 scheduler replicas, 3 workers, 20 hot orders.
const (
	replicas    = 3
	workers     = 3
	hotOrders   = 20
	produceRate = 8 // jobs per second
	// Every ratedEvery-th job (each 5 s) comes with a burst of ratedBurst
	// rate-limited calls of one client (demo:api.call, 2 a second, 2 at
	// once): about 2.5 s of its quota.
	ratedEvery  = 40
	ratedBurst  = 6
	lockTTL     = 2 * time.Second
	tickLockTTL = 2 * time.Second
	prefix      = "lockstep:"
	drainBound  = 90 * time.Second // after traffic stops, for every job to finish
	stopBound   = 15 * time.Second // for a process to exit after SIGTERM
)

// The schedules every replica runs: each second and every two seconds, on
// orders the producer also uses, so ticks contend with jobs.
var schedules = []struct{ name, cron, order string }{
	{"chaos-pay-1", "* * * * * *", "1"},
	{"chaos-pay-2", "* * * * * *", "2"},
	{"chaos-settle-3", "*/2 * * * * *", "3"},
}

// clusterMasters is the Cluster mode's number of masters, each with a replica.
const clusterMasters = 3

func schedulerConfig(redisYAML string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `%slog:
  format: json
  level: debug
scheduler:
  max_clock_skew: 500ms
  tick_lock_ttl: %s
  task_retention: 1h
  max_catch_up: 100
schedules:
`, redisYAML, tickLockTTL)
	for i, s := range schedules {
		fmt.Fprintf(&b, `  - name: %s
    cron: %q
    task: %s
    payload: {"order_id": %q, "work_ms": %d}
    queue: %s
    timeout: 30s
    max_retry: 25
    catch_up: all
`, s.name, s.cron, demoType, s.order, 100+400*i, demoQueue)
	}
	return b.String()
}

// workerConfig is a worker's file; lockExtra adds lines under lock: (the
// etcd back end), extra top-level sections (demo:).
func workerConfig(redisYAML, lockExtra, extra string) string {
	return fmt.Sprintf(`%slog:
  format: json
  level: info
lock:
  prefix: %q
  ttl: %s
%sworker:
  concurrency: 4
  shutdown_timeout: 3s
  contention_backoff_min: 50ms
  contention_backoff_max: 1s
  demo: true
%s`, redisYAML, prefix, lockTTL, lockExtra, extra)
}

// redisTimeout is every client's dial, read and write timeout: a dead or
// paused Redis is noticed within a second.
const redisTimeout = time.Second

// redisSection is both roles' redis: section for the server at addr, or
// (cluster) the Cluster whose nodes are addrs.
func redisSection(cluster bool, addrs ...string) string {
	where := fmt.Sprintf("  addr: %q\n", addrs[0])
	if cluster {
		where = fmt.Sprintf("  mode: cluster\n  addrs: [%s]\n", strings.Join(addrs, ", "))
	}
	return fmt.Sprintf("redis:\n%s  dial_timeout: %v\n  read_timeout: %v\n  write_timeout: %v\n", where, redisTimeout, redisTimeout, redisTimeout)
}

// run is one chaos run's state.
type run struct {
	tb      testing.TB
	cfg     Config
	rng     *rand.Rand         // the fault schedule's
	redis   *redistest.Server  // the single server, nil in the Cluster mode
	cluster *redistest.Cluster // the Cluster in the Cluster mode, else nil
	rc      redis.UniversalClient

	schedulers []*role
	workers    []*role
	proxies    []*redistest.Proxy
	etcd       *etcdtest.Cluster // the locks' store in the etcd mode, else nil
	pg         *sqltest.DB       // the demo's store in the postgres mode, else nil

	hist    History
	faults  atomic.Int64
	current atomic.Value // string: the fault under way
}

// option returns v, or def when v is empty; anything but def and other fails
// the run.
func option(tb testing.TB, what, v, def, other string) string {
	tb.Helper()
	switch v {
	case "", def:
		return def
	case other:
		return other
	}
	tb.Fatalf("chaos: %s %q: want %s or %s", what, v, def, other)
	return ""
}

// Run runs the binaries under cfg's fault schedule, then checks the history.
// It returns the report and the history it was made from; every process it
// started is gone when it returns.
func Run(tb testing.TB, cfg Config) (*Report, History) {
	tb.Helper()
	if cfg.Duration < 30*time.Second {
		tb.Fatalf("chaos: duration %v is too short (at least 30s)", cfg.Duration)
	}
	cfg.Lock = option(tb, "lock back end", cfg.Lock, "redis", "etcd")
	cfg.Store = option(tb, "demo store", cfg.Store, "redis", "postgres")
	cfg.Redis = option(tb, "redis", cfg.Redis, "single", "cluster")
	known := AllFaults
	if cfg.Redis == "cluster" {
		known = slices.Concat(slices.DeleteFunc(slices.Clone(AllFaults), func(k string) bool {
			return redisFault(k) || k == FaultWorkerPartition
		}), ClusterFaults)
	}
	if cfg.Lock == "etcd" {
		known = slices.Concat(known, EtcdFaults)
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = known
	} else if cfg.Lock == "etcd" {
		cfg.Faults = append(append([]string(nil), cfg.Faults...), EtcdFaults...)
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(known, f) {
			tb.Fatalf("chaos: unknown fault kind %q (known: %s)", f, strings.Join(known, ", "))
		}
	}
	logDir := filepath.Join(cfg.Out, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	r := &run{tb: tb, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6c6f636b))}
	r.current.Store("")

	schedBin, workerBin := build(tb, proctest.TempDir(tb))
	if cfg.Redis == "cluster" {
		r.cluster = redistest.StartClusterWithReplicas(tb, clusterMasters)
	} else {
		r.redis = redistest.StartAOF(tb)
	}
	r.rc = r.client(redisTimeout)
	tb.Cleanup(func() { _ = r.rc.Close() })
	var lockYAML string
	if cfg.Lock == "etcd" {
		r.etcd = etcdtest.StartCluster(tb, 3)
		lockYAML = fmt.Sprintf("  backend: etcd\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 2s\n    election_timeout: %v\n",
			strings.Join(r.etcd.Endpoints(), ", "), etcdtest.ElectionTimeout)
	}
	var demoYAML string
	if cfg.Store == "postgres" {
		r.pg = sqltest.Postgres(tb)
		demoYAML = fmt.Sprintf("demo:\n  store: postgres\n  postgres_dsn: %q\n", r.pg.DSN)
	}
	redisYAML := func(addr string) string { return redisSection(false, addr) }
	if r.cluster != nil {
		// Every node is a seed: the client reads the topology from whichever
		// answers, whatever the faults made of the roles.
		all := redisSection(true, redistestAddrs(r.cluster.Servers())...)
		redisYAML = func(string) string { return all }
	}
	schedCfg := writeFile(tb, logDir, "scheduler.yaml", schedulerConfig(redisYAML(r.addr())))
	for i := range replicas {
		r.schedulers = append(r.schedulers, &role{name: fmt.Sprintf("scheduler-%d", i+1), bin: schedBin, config: schedCfg, logDir: logDir})
	}
	for i := range workers {
		addr := r.addr()
		if r.redis != nil { // a worker's link to the one server can be cut (worker_blackhole)
			p := redistest.StartProxy(tb, r.redis.Addr)
			r.proxies = append(r.proxies, p)
			addr = p.Addr
		}
		name := fmt.Sprintf("worker-%d", i+1)
		r.workers = append(r.workers, &role{name: name, bin: workerBin, logDir: logDir,
			config: writeFile(tb, logDir, name+".yaml", workerConfig(redisYAML(addr), lockYAML, demoYAML))})
	}
	tb.Cleanup(func() { // whatever happened, no process outlives the run
		for _, p := range append(r.schedulers, r.workers...) {
			p.kill()
		}
	})
	for _, p := range append(r.workers, r.schedulers...) {
		p.start(tb)
	}

	r.hist = History{Seed: cfg.Seed, Start: time.Now(), Lock: cfg.Lock, LockTTL: lockTTL, Store: cfg.Store, Redis: cfg.Redis}
	firstTick := time.Now().Truncate(time.Second).Add(2 * time.Second)
	ctx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var produced []Job
	wg.Go(func() { produced = r.produce(ctx) })
	progressDone := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() { r.progress(progressDone) })

	quiet := max(cfg.Duration/6, 10*time.Second)
	r.inject(r.hist.Start.Add(cfg.Duration - quiet))
	r.current.Store("quiet")
	time.Sleep(time.Until(r.hist.Start.Add(cfg.Duration))) // the quiet tail: traffic, no faults
	r.hist.End = time.Now()

	stopTraffic()
	wg.Wait()
	r.hist.Jobs = produced
	r.current.Store("stopping schedulers")
	for _, s := range r.schedulers {
		if !s.term(stopBound) {
			tb.Logf("chaos: %s did not exit within %v of SIGTERM; killed", s.name, stopBound)
		}
	}
	lastTick := time.Now().Add(-2 * time.Second)
	r.current.Store("draining")
	r.drain()
	close(progressDone)
	pwg.Wait()
	for _, w := range r.workers {
		if !w.term(stopBound) {
			tb.Logf("chaos: %s did not exit within %v of SIGTERM; killed", w.name, stopBound)
		}
	}

	r.collect(firstTick, lastTick)
	rep := Check(r.hist)
	return rep, r.hist
}

// addr is the single server's address ("" in the Cluster mode).
func (r *run) addr() string {
	if r.redis == nil {
		return ""
	}
	return r.redis.Addr
}

// client returns a new client of the run's Redis whose every call is bounded
// by timeout: of the single server (tried once), or the binaries' own
// Cluster client (config.RedisConfig.NewClient, which follows a failover).
func (r *run) client(timeout time.Duration) redis.UniversalClient {
	if r.cluster == nil {
		return redis.NewClient(&redis.Options{Addr: r.redis.Addr, MaxRetries: -1,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout})
	}
	c, err := config.RedisConfig{Mode: config.RedisCluster, Addrs: redistestAddrs(r.cluster.Servers()),
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout}.NewClient()
	if err != nil {
		r.tb.Fatalf("chaos: cluster client: %v", err)
	}
	return c
}

// redistestAddrs returns the servers' addresses.
func redistestAddrs(servers []*redistest.Server) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Addr)
	}
	return out
}

func writeFile(tb testing.TB, dir, name, text string) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	return path
}

// produce enqueues demo jobs on the hot orders at produceRate until ctx
// ends, with work_ms from 10ms to 1.5s (a fifth longer than a renewal
// interval), and returns each job with whether asynq acknowledged it.
func (r *run) produce(ctx context.Context) (out []Job) {
	client := asynq.NewClientFromRedisClient(r.rc)
	defer client.Close()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x6a6f6273)) // the traffic's, apart from the faults'
	tick := time.NewTicker(time.Second / produceRate)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		order := fmt.Sprint(1 + rng.IntN(hotOrders))
		work := 10 + rng.Int64N(300)
		if rng.IntN(5) == 0 {
			work = 700 + rng.Int64N(800)
		}
		typ, payload := demoType, []byte(nil)
		payload, _ = json.Marshal(demoPayload{OrderID: order, WorkMS: work})
		if n%3 == 0 {
			// A third of the jobs sync one of two tenants (limit 3): their
			// permits are held 3 at once.
			order = "tenant " + fmt.Sprint("t", 1+rng.IntN(2))
			typ = tenantType
			payload, _ = json.Marshal(tenantPayload{TenantID: strings.TrimPrefix(order, "tenant "), WorkMS: work})
		}
		enqueue := func(id, order, typ string, payload []byte) {
			ectx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := client.EnqueueContext(ectx, asynq.NewTask(typ, payload), asynq.TaskID(id),
				asynq.Queue(demoQueue), asynq.MaxRetry(25), asynq.Timeout(30*time.Second), asynq.Retention(time.Hour))
			cancel()
			out = append(out, Job{ID: id, OrderID: order, Acked: err == nil})
		}
		enqueue(fmt.Sprintf("job-%d", n), order, typ, payload)
		if n%ratedEvery == 0 {
			// A burst of calls for one of two clients, over its quota: the
			// rate delays most of them to their turns.
			c := fmt.Sprint("c", 1+(n/ratedEvery)%2)
			payload, _ := json.Marshal(ratedPayload{ClientID: c, WorkMS: 50})
			for k := range ratedBurst {
				enqueue(fmt.Sprintf("call-%d-%d", n, k), "client "+c, ratedType, payload)
			}
		}
	}
}

// progress prints the live line: in place on a terminal, else every 10s.
func (r *run) progress(done <-chan struct{}) {
	w := r.cfg.Progress
	if w == nil {
		return
	}
	every, ending := 10*time.Second, "\n"
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			every, ending = time.Second, ""
		}
	}
	c := r.client(200 * time.Millisecond)
	defer c.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	execs := "?"
	line := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if n, err := c.XLen(ctx, demoStream(prefix)).Result(); err == nil {
			execs = fmt.Sprint(n)
		}
		cancel()
		prefixCR := ""
		if ending == "" {
			prefixCR = "\r\033[K"
		}
		fmt.Fprintf(w, "%schaos seed %d  %s / %s  faults %d  executions %s  now: %s%s", prefixCR, r.cfg.Seed,
			time.Since(r.hist.Start).Round(time.Second), r.cfg.Duration, r.faults.Load(), execs, r.current.Load(), ending)
	}
	for {
		select {
		case <-done:
			line()
			if ending == "" {
				fmt.Fprintln(w)
			}
			return
		case <-t.C:
			line()
		}
	}
}

// inject runs the fault schedule until the deadline: rounds in which each
// kind comes once, in an order the seed shuffles, 2–5s apart.
func (r *run) inject(deadline time.Time) {
	var round []string
	for {
		gap := time.Duration(2000+r.rng.IntN(3000)) * time.Millisecond
		if len(round) == 0 {
			round = append([]string(nil), r.cfg.Faults...)
			r.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		kind := round[0]
		// Draw every parameter before deciding whether there is time, so
		// that one seed gives one schedule whatever the machine's speed.
		f := r.draw(kind)
		if time.Now().Add(gap + f.budget).After(deadline) {
			return
		}
		round = round[1:]
		r.current.Store("waiting")
		time.Sleep(gap) // the schedule's own spacing, not a wait for an event
		r.current.Store(kind)
		fault := f.do()
		r.faults.Add(1)
		r.hist.Faults = append(r.hist.Faults, fault)
	}
}

// pausable is a process a fault can pause: a role, a Redis server, an etcd
// member (all proctest processes).
type pausable interface {
	Pause()
	Resume()
}

// plan is one drawn fault, ready to run.
type plan struct {
	budget time.Duration // at most how long it takes, restart included
	do     func() Fault
}

func (r *run) draw(kind string) plan {
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+r.rng.IntN(hi-lo+1)) * time.Millisecond }
	wi := r.rng.IntN(workers)
	si := r.rng.IntN(replicas)
	short, long := ms(200, 1500), ms(3000, 6000)
	down := ms(200, 2000)
	offset := ms(0, 999)
	if r.rng.IntN(2) == 0 {
		offset = ms(0, 60) // between a tick's claim and its enqueue, most likely
	}
	drain := ms(50, 2500)
	w, s := r.workers[wi], r.schedulers[si]
	restartBudget := 3 * time.Second // a restart is usually ready in 1s; a slower one eats into the quiet tail
	onWorker := func(detail string) func() Fault { return func() Fault { return r.begin(kind, w, detail) } }
	on := func(target, detail string) func() Fault {
		return func() Fault { return Fault{Kind: kind, Target: target, Start: time.Now(), Detail: detail} }
	}
	// restarted kills a process, leaves it down for down, and starts it again.
	restarted := func(budget time.Duration, begin func() Fault, kill, restart func()) plan {
		return plan{budget, func() Fault {
			f := begin()
			kill()
			time.Sleep(down)
			restart()
			return r.end(f)
		}}
	}
	// paused stops a process (SIGSTOP) for d, then continues it; target
	// finds it when the fault starts.
	paused := func(budget, d time.Duration, begin func() Fault, target func() pausable) plan {
		return plan{budget, func() Fault {
			p := target()
			f := begin()
			p.Pause()
			time.Sleep(d)
			p.Resume()
			return r.end(f)
		}}
	}
	pauseDetail := func(d time.Duration) string { return fmt.Sprintf("SIGSTOP for %v (lock TTL %v)", d, lockTTL) }
	switch kind {
	case FaultWorkerKill:
		return plan{down + restartBudget, func() Fault {
			f := r.begin(kind, w, "SIGKILL mid-work, restarted after "+down.String())
			w.kill()
			f.Holds, f.Active = r.holdsOf(f.Worker), r.activeTasks()
			time.Sleep(down)
			w.start(r.tb)
			return r.end(f)
		}}
	case FaultWorkerKillDrain:
		return plan{drain + down + restartBudget, func() Fault {
			f := r.begin(kind, w, fmt.Sprintf("SIGTERM, SIGKILL %v into the drain, restarted after %v", drain, down))
			if w.term(drain) { // drained before the kill came
				f.Detail += " (had exited by itself)"
			}
			f.Holds, f.Active = r.holdsOf(f.Worker), r.activeTasks()
			time.Sleep(down)
			w.start(r.tb)
			return r.end(f)
		}}
	case FaultSchedulerKill:
		begin := func() Fault {
			next := time.Now().Truncate(time.Second).Add(time.Second)
			time.Sleep(time.Until(next.Add(offset)))
			return r.begin(kind, s, fmt.Sprintf("SIGKILL %v into a tick, restarted after %v", offset, down))
		}
		return restarted(time.Second+offset+down+restartBudget, begin, s.kill, func() { s.start(r.tb) })
	case FaultWorkerPauseShort, FaultWorkerPauseLong:
		d := short
		if kind == FaultWorkerPauseLong {
			d = long
		}
		return paused(d, d, onWorker(pauseDetail(d)), func() pausable { return w })
	case FaultRedisPauseShort, FaultRedisPauseLong:
		d := short
		if kind == FaultRedisPauseLong {
			d = long
		}
		return paused(d, d, on("redis", pauseDetail(d)), func() pausable { return r.redis })
	case FaultRedisKill:
		return restarted(down+10*time.Second, on("redis", fmt.Sprintf("SIGKILL, restarted from its AOF after %v", down)),
			r.redis.Kill, r.redis.Restart)
	case FaultEtcdLeaderPause:
		return paused(long+5*time.Second, long, on("etcd-leader", pauseDetail(long)),
			func() pausable { return r.etcd.Leader() })
	case FaultEtcdMemberKill:
		m := r.etcd.Members[r.rng.IntN(len(r.etcd.Members))]
		return restarted(down+10*time.Second, on("etcd-member", fmt.Sprintf("SIGKILL, restarted with its data after %v", down)),
			m.Kill, m.Restart)
	case FaultClusterMasterKill:
		mi := r.rng.IntN(clusterMasters)
		return plan{down + 20*time.Second, func() Fault {
			m, replica := r.master(mi)
			f := Fault{Kind: kind, Target: "master " + m.Addr, Start: time.Now(), Resources: r.resourcesOn(m)}
			m.Kill()
			f.Start = time.Now()
			if !redistest.Within(clusterBound, 20*time.Millisecond, func() bool { return r.isMaster(replica) }) {
				r.tb.Fatalf("chaos: %s's replica %s was not promoted within %v of its kill", m.Addr, replica.Addr, clusterBound)
			}
			f.Promoted = time.Now()
			time.Sleep(down)
			m.Restart()
			r.waitWhole()
			f.Detail = fmt.Sprintf("SIGKILL; replica %s promoted after %v; restarted empty %v later, back as a replica",
				replica.Addr, f.Promoted.Sub(f.Start).Round(time.Millisecond), down)
			return r.end(f)
		}}
	case FaultClusterMasterPauseShort, FaultClusterMasterPauseLong:
		mi := r.rng.IntN(clusterMasters)
		d := ms(200, 800) // under the node timeout (1 s): no failover
		if kind == FaultClusterMasterPauseLong {
			d = ms(3000, 5000) // past the node timeout: the replica takes over
		}
		return plan{d + 20*time.Second, func() Fault {
			m, replica := r.master(mi)
			f := Fault{Kind: kind, Target: "master " + m.Addr, Start: time.Now(), Resources: r.resourcesOn(m)}
			m.Pause()
			f.Start = time.Now()
			// The pause lasts d whatever happens; meanwhile, watch for the
			// replica taking over.
			for until := f.Start.Add(d); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
				if f.Promoted.IsZero() && r.isMaster(replica) {
					f.Promoted = time.Now()
				}
			}
			m.Resume()
			f.Detail = fmt.Sprintf("SIGSTOP for %v (node timeout 1s, lock TTL %v)", d, lockTTL)
			if kind == FaultClusterMasterPauseLong {
				r.waitWhole()
				if f.Promoted.IsZero() && r.isMaster(replica) {
					f.Promoted = time.Now()
				}
				if !f.Promoted.IsZero() {
					f.Detail += fmt.Sprintf("; replica %s promoted after %v, the master back as its replica",
						replica.Addr, f.Promoted.Sub(f.Start).Round(time.Millisecond))
				} else {
					f.Detail += "; no failover"
				}
			}
			return r.end(f)
		}}
	case FaultClusterReplicaKill:
		ri := r.rng.IntN(clusterMasters)
		return plan{down + 20*time.Second, func() Fault {
			_, replica := r.master(ri)
			f := Fault{Kind: kind, Target: "replica " + replica.Addr, Start: time.Now(),
				Detail: fmt.Sprintf("SIGKILL, restarted empty after %v, resynced", down)}
			replica.Kill()
			time.Sleep(down)
			replica.Restart()
			r.waitWhole()
			return r.end(f)
		}}
	case FaultWorkerPartition:
		return plan{long, func() Fault {
			f := r.begin(kind, w, fmt.Sprintf("link to Redis black-holed for %v", long))
			r.proxies[wi].Blackhole()
			time.Sleep(long)
			r.proxies[wi].Restore()
			return r.end(f)
		}}
	}
	panic("chaos: unknown fault " + kind)
}

// clusterBound bounds a Cluster's promotion of a replica, and its return to
// whole (every node up, 3 masters each with a linked replica) after a fault.
const clusterBound = 30 * time.Second

// master returns the i-th of the Cluster's masters now (by port) and its
// replica.
func (r *run) master(i int) (m, replica *redistest.Server) {
	masters, replicaOf, _ := r.cluster.Roles(time.Second)
	if len(masters) != clusterMasters {
		r.tb.Fatalf("chaos: the Cluster has %d masters, want %d", len(masters), clusterMasters)
	}
	m = masters[i%len(masters)]
	for rep, of := range replicaOf {
		if of == m {
			return m, rep
		}
	}
	r.tb.Fatalf("chaos: master %s has no replica", m.Addr)
	return nil, nil
}

// isMaster reports whether s says it is a master now.
func (r *run) isMaster(s *redistest.Server) bool {
	masters, _, _ := r.cluster.Roles(200 * time.Millisecond)
	return slices.Contains(masters, s)
}

// waitWhole waits until the Cluster is whole again (redistest's Healthy).
func (r *run) waitWhole() {
	why := ""
	if !redistest.Within(clusterBound, 50*time.Millisecond, func() (ok bool) {
		ok, why = r.cluster.Healthy(300 * time.Millisecond)
		return ok
	}) {
		r.tb.Fatalf("chaos: the Cluster was not whole again within %v: %s", clusterBound, why)
	}
}

// resourcesOn returns what the checker judges runs on (runKey: the hot
// orders, the tenants' permits) whose locks master m serves.
func (r *run) resourcesOn(m *redistest.Server) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slots, err := r.rc.ClusterSlots(ctx).Result()
	if err != nil {
		r.tb.Logf("chaos: CLUSTER SLOTS: %v", err)
		return nil
	}
	lk := lock.New(r.rc)
	on := func(resource string) bool {
		slot, err := r.rc.ClusterKeySlot(ctx, lk.Key(resource)).Result()
		if err != nil {
			return false
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
				return s.Nodes[0].Addr == m.Addr
			}
		}
		return false
	}
	var out []string
	for i := 1; i <= hotOrders; i++ {
		if order := fmt.Sprint(i); on(orderResource(order)) {
			out = append(out, order)
		}
	}
	for _, t := range []string{"t1", "t2"} {
		if on(tenantResource(t)) {
			for p := range tenantLimit {
				out = append(out, runKey(Execution{TenantID: t, Permit: p}))
			}
		}
	}
	return out
}

// holdsOf returns the task ids of worker's hold records (recovery's view of
// what it has in its hands), nil when they cannot be read.
func (r *run) holdsOf(worker string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	recs, err := lock.New(r.rc).Registry(r.rc, "").Records(ctx, worker)
	if err != nil {
		return nil
	}
	ids := []string{}
	for _, rec := range recs {
		if _, _, id, ok := lock.ParseHoldRecord(rec); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// activeTasks returns the ids of the tasks asynq has active in the demo's
// queue (its own Inspector), nil when they cannot be read: right after a
// worker's SIGKILL, the tasks it had in its hands among them.
func (r *run) activeTasks() []string {
	insp := asynq.NewInspectorFromRedisClient(r.rc)
	defer insp.Close()
	ids := []string{}
	for page := 1; page <= 10; page++ {
		tasks, err := insp.ListActiveTasks(demoQueue, asynq.Page(page), asynq.PageSize(100))
		if err != nil {
			return nil
		}
		for _, t := range tasks {
			ids = append(ids, t.ID)
		}
		if len(tasks) < 100 {
			return ids
		}
	}
	return ids
}

func (r *run) begin(kind string, p *role, detail string) Fault {
	f := Fault{Kind: kind, Target: p.name, Start: time.Now(), Detail: detail}
	if f.PID = p.Pid(); f.PID != 0 {
		if strings.HasPrefix(p.name, "worker") {
			f.Worker = procid.Of(f.PID)
		}
	}
	return f
}

func (r *run) end(f Fault) Fault {
	f.End = time.Now()
	return f
}

// drain waits, within drainBound, until no task is left to run in the
// queue. Tasks waiting for a retry are made ready at once: a run that failed
// to record itself (Redis was down) waits asynq's default backoff of 15s
// and more, which would only lengthen the run, not change what it checks.
func (r *run) drain() {
	insp := asynq.NewInspectorFromRedisClient(r.rc)
	defer insp.Close()
	deadline := time.Now().Add(drainBound)
	for time.Now().Before(deadline) {
		q, err := insp.GetQueueInfo(demoQueue)
		if err == nil && q.Pending+q.Active+q.Scheduled+q.Retry+q.Aggregating == 0 {
			return
		}
		if err == nil && q.Retry > 0 {
			_, _ = insp.RunAllRetryTasks(demoQueue)
		}
		time.Sleep(200 * time.Millisecond) // polling the queue, the observable itself
	}
	r.tb.Logf("chaos: the queue did not drain within %v", drainBound)
}

// collect reads the history: the demo's streams, asynq's final states and
// the replicas' logs.
func (r *run) collect(firstTick, lastTick time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &r.hist
	execs, complete, err := readStream(ctx, r.rc, demoStream(prefix))
	if err != nil {
		r.tb.Logf("chaos: read %s: %v", demoStream(prefix), err)
	}
	h.ExecutionsComplete = complete && err == nil
	for _, m := range execs {
		h.Executions = append(h.Executions, Execution{
			OrderID: m["order_id"], TenantID: m["tenant_id"], Permit: int(atoi(m["permit"])),
			Fence: atoi(m["fence"]), Worker: m["worker"], TaskID: m["task_id"],
			Started: msTime(m["started_ms"]), Finished: msTime(m["finished_ms"]), Outcome: m["outcome"],
		})
	}
	if cc, ok := r.rc.(*redis.ClusterClient); ok && r.pg == nil {
		r.collectClusterWrites(ctx, cc)
	} else if r.pg != nil {
		r.collectPostgresWrites(ctx)
	} else if n, err := r.rc.Exists(ctx, demoWrites(prefix)).Result(); err == nil && n == 1 {
		writes, complete, err := readStream(ctx, r.rc, demoWrites(prefix))
		h.WritesAvailable, h.WritesComplete = true, complete && err == nil
		for _, m := range writes {
			h.Writes = append(h.Writes, Write{OrderID: m["order_id"], Fence: atoi(m["fence"]), TaskID: m["task_id"],
				Worker: m["worker"], Op: m["op"], At: msTime(m["at_ms"])})
		}
	}
	// The tenants' store is fenced per (tenant, permit): its log names each
	// "<tenant>/<permit>", checked like an order.
	if n, err := r.rc.Exists(ctx, tenantWrites(prefix)).Result(); r.pg == nil && r.cluster == nil && err == nil && n == 1 {
		writes, complete, err := readStream(ctx, r.rc, tenantWrites(prefix))
		h.WritesComplete = h.WritesComplete && complete && err == nil
		for _, m := range writes {
			h.Writes = append(h.Writes, Write{OrderID: "tenant " + m["order_id"], Fence: atoi(m["fence"]), TaskID: m["task_id"],
				Worker: m["worker"], Op: m["op"], At: msTime(m["at_ms"])})
		}
	}

	calls, complete, err := readStream(ctx, r.rc, ratedStream(prefix))
	if err != nil {
		r.tb.Logf("chaos: read %s: %v", ratedStream(prefix), err)
	}
	h.RatedComplete = complete && err == nil
	for _, m := range calls {
		s := RatedStart{Client: m["client_id"], TaskID: m["task_id"], Worker: m["worker"], Started: time.UnixMicro(atoi(m["started_us"]))}
		if us := atoi(m["admitted_us"]); us > 0 {
			s.Admitted = time.UnixMicro(us)
		}
		h.RatedStarts = append(h.RatedStarts, s)
	}

	insp := asynq.NewInspectorFromRedisClient(r.rc)
	defer insp.Close()
	state := func(id string) string {
		info, err := insp.GetTaskInfo(demoQueue, id)
		if err != nil {
			return ""
		}
		return info.State.String()
	}
	for i := range h.Jobs {
		if h.Jobs[i].Acked {
			h.Jobs[i].State = state(h.Jobs[i].ID)
		}
	}
	for _, s := range schedules {
		spec, err := scheduler.ParseSpec(s.cron, time.UTC)
		if err != nil {
			r.tb.Fatalf("chaos: schedule %s: %v", s.name, err)
		}
		for t := spec.Next(firstTick.Add(-time.Second)); !t.After(lastTick); t = spec.Next(t) {
			h.Ticks = append(h.Ticks, Tick{Schedule: s.name, Tick: t.Unix(), State: state(scheduler.TaskID(s.name, t))})
		}
	}

	for _, w := range r.workers {
		for _, path := range w.logs {
			if err := readLog(path, h, ReadWorkerLog); err != nil {
				r.tb.Logf("chaos: %s: %v", path, err)
			}
		}
	}
	h.ReplicaLogsComplete = true
	for _, s := range r.schedulers {
		for _, path := range s.logs {
			if err := readReplicaLog(path, h); err != nil {
				r.tb.Logf("chaos: %s: %v", path, err)
				h.ReplicaLogsComplete = false
			}
		}
	}
}

// collectClusterWrites reads the accepted-writes logs of every record of the
// demo's store on the Cluster (one per record, in its slot) into the history.
func (r *run) collectClusterWrites(ctx context.Context, c *redis.ClusterClient) {
	h := &r.hist
	orders, tenants, err := recordWriteLogs(ctx, c, prefix)
	if err != nil {
		r.tb.Logf("chaos: find the demo's accepted-writes logs: %v", err)
		return
	}
	h.WritesAvailable, h.WritesComplete = len(orders)+len(tenants) > 0, true
	for _, key := range slices.Concat(orders, tenants) {
		writes, complete, err := readStream(ctx, r.rc, key)
		h.WritesComplete = h.WritesComplete && complete && err == nil
		name := ""
		if slices.Contains(tenants, key) {
			name = "tenant " // as the single server's tenants' log is read
		}
		for _, m := range writes {
			h.Writes = append(h.Writes, Write{OrderID: name + m["order_id"], Fence: atoi(m["fence"]), TaskID: m["task_id"],
				Worker: m["worker"], Op: m["op"], At: msTime(m["at_ms"])})
		}
	}
}

// collectPostgresWrites reads the PostgreSQL store's log table into the
// history.
func (r *run) collectPostgresWrites(ctx context.Context) {
	h := &r.hist
	writes, err := postgresWrites(ctx, r.pg.DB)
	if err != nil {
		r.tb.Logf("chaos: read the demo's PostgreSQL log: %v", err)
		return
	}
	h.Writes, h.WritesAvailable, h.WritesComplete = append(h.Writes, writes...), true, true
}

// postgresWrites returns the rows of the PostgreSQL store's log table as the
// history's writes: the orders' and the tenants' (named "tenant
// <tenant>/<permit>", as from Redis), each in the store's order.
func postgresWrites(ctx context.Context, db *sql.DB) ([]Write, error) {
	orders, tenants, err := readPostgresWrites(ctx, db)
	if err != nil {
		return nil, err
	}
	var out []Write
	for _, w := range orders {
		out = append(out, Write{OrderID: w.OrderID, Fence: w.Fence, TaskID: w.TaskID,
			Worker: w.Worker, Op: w.Op, At: time.UnixMilli(w.AtMS)})
	}
	for _, w := range tenants {
		out = append(out, Write{OrderID: "tenant " + w.OrderID, Fence: w.Fence, TaskID: w.TaskID,
			Worker: w.Worker, Op: w.Op, At: time.UnixMilli(w.AtMS)})
	}
	return out, nil
}
