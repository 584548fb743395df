package main

// fair/2000+20: issue 39's fairness scenario, Lockstep's FairBy beside plain
// asynq (FIFO) on the same redis-server, run once after the other runs.
// Tenant A's 2,000 tasks are enqueued with asynq's own client before tenant
// B's 20, equal weights, one handler of fairWork each, one server of 2
// slots. Figures: when B's last task completed (from the first start) and
// that time as a share of FIFO's, and Jain's index of the two tenants'
// starts from B's first start to its last (1: equal shares).

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/metrics"
	"github.com/lockstep-dev/lockstep/internal/watchdog"
)

const (
	fairA, fairB = 2000, 20
	fairWork     = 5 * time.Millisecond
	fairSlots    = 2
)

// fairRun is one start and end of a task of the scenario.
type fairStart struct {
	tenant     string
	start, end time.Time
}

// fairResult is one side's figures.
type fairResult struct {
	name  string
	bLast time.Duration // B's last completion after the first start
	jain  float64       // over B's first start to its last
	a, b  int           // the starts of each in that stretch
	all   time.Duration // the last completion of all
}

// fairScenario runs both sides, each on a queue of its own.
func fairScenario(addr string) []fairResult {
	return []fairResult{
		fairSide(addr, "plain asynq (FIFO)", "fair-fifo", false),
		fairSide(addr, "Lockstep FairBy", "fair-lockstep", true),
	}
}

func fairSide(addr, name, queue string, fair bool) fairResult {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 20, ContextTimeoutEnabled: true})
	defer c.Close()
	enq := asynq.NewClientFromRedisClient(c)
	for i := range fairA + fairB {
		tenant := "A"
		if i >= fairA {
			tenant = "B"
		}
		if _, err := enq.Enqueue(asynq.NewTask("bench:fair", []byte(`{"tenant":"`+tenant+`"}`)), asynq.Queue(queue)); err != nil {
			panic(err)
		}
	}
	var mu sync.Mutex
	var starts []fairStart
	done := make(chan struct{})
	work := func(tenant string) {
		s := time.Now()
		time.Sleep(fairWork)
		mu.Lock()
		starts = append(starts, fairStart{tenant, s, time.Now()})
		if len(starts) == fairA+fairB {
			close(done)
		}
		mu.Unlock()
	}
	tenantOf := func(b []byte) string {
		var p struct{ Tenant string }
		_ = json.Unmarshal(b, &p)
		return p.Tenant
	}
	var stop func()
	if fair {
		reg, err := jobs.NewRegistry([]jobs.Spec{{
			Type:   "bench:fair",
			Decode: func(b []byte) (any, error) { return tenantOf(b), nil },
			Fair:   func(p any) (string, int) { return p.(string), 1 },
			Run:    func(_ context.Context, _ jobs.Job, p any) error { work(p.(string)); return nil },
		}})
		if err != nil {
			panic(err)
		}
		m := metrics.New(nil)
		l := lock.New(c)
		wd := watchdog.New(watchdog.Options{Metrics: m})
		srv := jobs.NewServer(jobs.Params{Client: c, Locker: l, Watchdog: wd, Registry: reg, Metrics: m,
			Config: jobs.Config{Queues: map[string]int{queue: 1}, Concurrency: fairSlots}})
		if err := wd.Start(ctx); err != nil {
			panic(err)
		}
		if err := srv.Start(ctx); err != nil {
			panic(err)
		}
		stop = func() { _ = srv.Stop(ctx); _ = wd.Stop(ctx) }
	} else {
		srv := asynq.NewServerFromRedisClient(c, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: fairSlots,
			TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.FatalLevel})
		if err := srv.Start(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error { work(tenantOf(t.Payload())); return nil })); err != nil {
			panic(err)
		}
		stop = srv.Shutdown
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		panic("fair scenario: not every task ran within 5 minutes")
	}
	stop()
	return fairFigures(name, starts)
}

// fairFigures measures a side's starts.
func fairFigures(name string, starts []fairStart) fairResult {
	r := fairResult{name: name}
	slices.SortFunc(starts, func(x, y fairStart) int { return x.start.Compare(y.start) })
	first := starts[0].start
	var bFirst, bLast time.Time
	for _, s := range starts {
		r.all = max(r.all, s.end.Sub(first))
		if s.tenant == "B" {
			if bFirst.IsZero() {
				bFirst = s.start
			}
			bLast = s.start
			r.bLast = max(r.bLast, s.end.Sub(first))
		}
	}
	for _, s := range starts {
		if !s.start.Before(bFirst) && !s.start.After(bLast) {
			if s.tenant == "A" {
				r.a++
			} else {
				r.b++
			}
		}
	}
	a, b := float64(r.a), float64(r.b)
	r.jain = (a + b) * (a + b) / (2 * (a*a + b*b))
	return r
}

func reportFair(rs []fairResult) {
	fmt.Printf("\n### fair/%d+%d: tenant A's %d tasks enqueued (asynq's client) before tenant B's %d, %v each, one server of %d slots, one run\n\n",
		fairA, fairB, fairA, fairB, fairWork, fairSlots)
	fmt.Println("| side | B's last done (from the first start) | vs FIFO | all done | starts A:B while both wait | Jain's index |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	fifo := rs[0].bLast
	for _, r := range rs {
		fmt.Printf("| %s | %v | %.3f | %v | %d:%d | %.4f |\n", r.name, r.bLast.Round(time.Millisecond),
			float64(r.bLast)/float64(cmp.Or(fifo, 1)), r.all.Round(time.Millisecond), r.a, r.b, r.jain)
	}
}
