package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// Each tenant waiting in a fair share, in `lockstep fair` and /api/fair:
// its weight, its backlog and its share of the starts while these wait;
// a tenant whose tasks all started is gone from the list, and with none
// waiting the command exits 1.
func TestFairShowsTenantsBacklogAndShare(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := lock.New(srv.Client())
	ctx := context.Background()
	scope := lock.FairScope("default", "sync:tenant")
	// Four tasks seen: three of A (weight 1), one of B (weight 3); none asks
	// to run and none is started.
	seen := []lock.FairTask{{ID: "a1", Tenant: "A", Weight: 1}, {ID: "a2", Tenant: "A", Weight: 1},
		{ID: "b1", Tenant: "B", Weight: 3}, {ID: "a3", Tenant: "A", Weight: 1}}
	if _, err := l.Fair(ctx, scope, lock.FairAsk{Seen: seen, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var all []map[string]any
	cliJSON(t, srv.Addr, 0, &all, "fair", "--json")
	if len(all) != 2 {
		t.Fatalf("fair --json: %v, want A and B", all)
	}
	for i, want := range []map[string]any{
		{"queue": "default", "type": "sync:tenant", "tenant": "A", "weight": float64(1), "backlog": float64(3), "share": 0.25, "started": float64(0), "backend": "redis"},
		{"queue": "default", "type": "sync:tenant", "tenant": "B", "weight": float64(3), "backlog": float64(1), "share": 0.75, "started": float64(0), "backend": "redis"},
	} {
		for k, v := range want {
			if all[i][k] != v {
				t.Fatalf("fair --json [%d]: %v; want %s %v", i, all[i], k, v)
			}
		}
	}
	if res := cli(t, srv.Addr, "", "fair"); res.code != 0 || !strings.Contains(res.stdout, "TENANT") ||
		!containsLine(res.stdout, "default", "sync:tenant", "B", "3", "1", "75.0%") {
		t.Fatalf("fair: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	// A's first and B's start (both tagged at the virtual time 0); B is
	// gone, A alone has the whole share.
	f, err := l.Fair(ctx, scope, lock.FairAsk{Release: 2, TTL: time.Minute})
	if err != nil || len(f.Started) != 2 || f.Started[0] != "a1" && f.Started[0] != "b1" {
		t.Fatalf("release 2: %+v, err %v", f, err)
	}
	cliJSON(t, srv.Addr, 0, &all, "fair", "--json")
	if len(all) != 1 || all[0]["tenant"] != "A" || all[0]["backlog"] != float64(2) || all[0]["share"] != float64(1) || all[0]["started"] != float64(2) {
		t.Fatalf("fair --json after two starts: %v; want A alone, 2 waiting, the whole share, 2 started", all)
	}
	base := startUI(t, srv.Addr)
	var api []fairView
	getJSON(t, base+"/api/fair", 200, &api)
	if len(api) != 1 || api[0].Tenant != "A" || api[0].Backlog != 2 {
		t.Fatalf("/api/fair: %+v", api)
	}
	var o struct {
		Fair []fairView `json:"fair"`
	}
	getJSON(t, base+"/api/overview", 200, &o)
	if len(o.Fair) != 1 || o.Fair[0].Tenant != "A" {
		t.Fatalf("/api/overview: fair %+v; want A", o.Fair)
	}

	// The two started are delivered (their workers take them), and two
	// more start: no tenant waits.
	for _, id := range f.Started {
		if f, err := l.Fair(ctx, scope, lock.FairAsk{Self: id, TTL: time.Minute}); err != nil || !f.Run {
			t.Fatalf("%s delivered on its turn: %+v, %v; want it to run", id, f, err)
		}
	}
	if f, err := l.Fair(ctx, scope, lock.FairAsk{Release: 2, TTL: time.Minute}); err != nil || len(f.Started) != 2 {
		t.Fatalf("release 2: %+v, %v", f, err)
	}
	if res := cli(t, srv.Addr, "", "fair"); res.code != 1 {
		t.Fatalf("fair with no tenant waiting: exit %d, want 1\n%s%s", res.code, res.stdout, res.stderr)
	}
}
