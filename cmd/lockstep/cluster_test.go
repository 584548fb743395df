package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// On a Redis Cluster, locks reads every master, and unlock deletes the key
// on the master that holds it.
func TestLocksAndUnlockOnCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	client := c.Client()
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	l := lock.New(client)
	const n = 12 // spread over the three masters' slots
	for i := range n {
		if _, err := l.TryAcquire(lock.WithJob(ctx, fmt.Sprintf("task-%d", i), "t:cluster"), fmt.Sprintf("res:%d", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"LOCKSTEP_REDIS_MODE=cluster", "LOCKSTEP_REDIS_ADDRS=" + strings.Join(c.Addrs(), ",")}
	locks := func() []lockView {
		r := cliEnv(t, env, "", "locks", "--json")
		var ls []lockView
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ls) != nil {
			t.Fatalf("locks --json on a cluster: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return ls
	}
	ls := locks()
	seen := map[string]bool{}
	for _, v := range ls {
		if v.Type != "t:cluster" || v.TaskID != "task-"+strings.TrimPrefix(v.Resource, "res:") || v.Fence <= 0 {
			t.Fatalf("lock %+v", v)
		}
		seen[v.Resource] = true
	}
	if len(ls) != n || len(seen) != n {
		t.Fatalf("locks on a cluster: %d (%d distinct), want %d", len(ls), len(seen), n)
	}
	if r := cliEnv(t, env, "", "unlock", "res:5", "--force", "--yes"); r.code != 0 {
		t.Fatalf("unlock on a cluster: exit %d: %s", r.code, r.stderr)
	}
	if got := len(locks()); got != n-1 {
		t.Fatalf("after unlock: %d locks, want %d", got, n-1)
	}
}
