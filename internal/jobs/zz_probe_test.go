package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

func BenchmarkProbeScripts(b *testing.B) {
	r := newBenchRig(b)
	ctx := context.Background()
	srv := NewServer(Params{Client: r.client, Locker: lock.New(r.client)})
	for _, mode := range []string{"take+handoff", "lock-acquire+release", "take-only", "ping"} {
		r.resetStats(b)
		const n = 5000
		begin := time.Now()
		for i := range n {
			res := fmt.Sprintf("%s-%d", mode, i)
			job := Job{ID: fmt.Sprint(i), Queue: "default", Resource: res}
			switch mode {
			case "take+handoff":
				t, err := srv.take(ctx, job, 30*time.Second, waitJoin)
				if err != nil {
					b.Fatal(err)
				}
				h := &handoff{mark: 'g', outcome: "ok"}
				if err := srv.release(t.lease, job, h)(ctx); err != nil {
					b.Fatal(err)
				}
			case "take-only":
				if _, err := srv.take(ctx, job, 30*time.Second, waitJoin); err != nil {
					b.Fatal(err)
				}
			case "lock-acquire+release":
				l, err := srv.locker.TryAcquire(ctx, res, 30*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				_ = l.Release(ctx)
			case "ping":
				r.client.Ping(ctx)
			}
		}
		st := r.stats(b)
		b.Logf("%s: %.1f us redis cpu/op, %.1f cmds/op, %v/op wall", mode, st.cpu.Seconds()*1e6/n, float64(st.commands)/n, time.Since(begin)/n)
	}
}
