package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/etcdtest"
)

func TestClusterServesAndSurvivesOneKilledMember(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cl := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	leader := c.Leader()
	leader.Kill()
	// A write in flight to the dead leader fails; the next goes to the new one.
	var err error
	for range 20 {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = cl.Put(pctx, "k", "v2")
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("put with the leader killed: %v", err)
	}
	resp, err := cl.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("get: %v %v", resp, err)
	}
}
