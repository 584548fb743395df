package jobs

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

func TestDemoDecode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		payload string
		ok      bool
	}{
		{`{"order_id":"42","work_ms":300}`, true},
		{`{"order_id":"42"}`, true},
		{`{"order_id":"","work_ms":1}`, false},
		{`{"order_id":42,"work_ms":1}`, false},
		{`{"order_id":"a}b","work_ms":1}`, false},
		{`{"order_id":"42","work_ms":-1}`, false},
		{`{"order_id":"42","work_ms":3600001}`, false},
		{`not json`, false},
	} {
		if _, err := decodeDemo([]byte(c.payload)); (err == nil) != c.ok {
			t.Errorf("decode %s: err %v, want ok=%t", c.payload, err, c.ok)
		}
	}
}

// The fenced store takes a fence equal to or above the last one, and refuses
// a lower one, naming the higher fence it holds.
func TestFencedWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testConfig())
	ctx := context.Background()
	key := DemoStore("lockstep:", "1")
	for _, c := range []struct {
		fence int64
		want  []any
	}{
		{1_700_000_000_000_010, []any{int64(1), int64(1_700_000_000_000_010)}},
		{1_700_000_000_000_005, []any{int64(0), int64(1_700_000_000_000_010)}},
		{1_700_000_000_000_010, []any{int64(1), int64(1_700_000_000_000_010)}},
		{1_700_000_000_000_011, []any{int64(1), int64(1_700_000_000_000_011)}},
	} {
		got, err := run(ctx, e.client, scriptFencedWrite, []string{key}, c.fence, "w", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.([]any), c.want) {
			t.Errorf("write fence %d: %v, want %v", c.fence, got, c.want)
		}
	}
	h := e.admin.HGetAll(ctx, key).Val()
	if h["fence"] != "1700000000000011" || h["writes"] != "3" || h["worker"] != "w" {
		t.Fatalf("store = %v", h)
	}
}

// execution is one entry of the demo stream.
type execution map[string]string

func readExecutions(t *testing.T, c *redis.Client) []execution {
	t.Helper()
	msgs, err := c.XRange(context.Background(), DemoStream("lockstep:"), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]execution, len(msgs))
	for i, m := range msgs {
		out[i] = execution{}
		for k, v := range m.Values {
			out[i][k] = v.(string)
		}
	}
	return out
}

// Each demo execution appends one entry with the contract's fields, plus the
// task id, for each outcome.
func TestDemoRecordsExecutions(t *testing.T) {
	t.Parallel()
	e := newDemoEnv(t, testConfig())
	ctx := context.Background()

	e.enqueue(DemoType, "ok", []byte(`{"order_id":"ok","work_ms":20}`))
	e.waitState("ok", asynq.TaskStateCompleted, 10*time.Second)

	// A store that has seen a higher fence refuses the write.
	e.admin.HSet(ctx, DemoStore("lockstep:", "stale"), "fence", "9000000000000000")
	e.enqueue(DemoType, "stale", []byte(`{"order_id":"stale","work_ms":0}`), asynq.MaxRetry(0))
	e.waitState("stale", asynq.TaskStateArchived, 10*time.Second)

	// Deleting the lock mid-work loses it.
	e.enqueue(DemoType, "lost", []byte(`{"order_id":"lost","work_ms":10000}`), asynq.MaxRetry(0))
	waitFor(t, 10*time.Second, "the lock", func() bool { return e.admin.Exists(ctx, "lockstep:{lock:order:lost}").Val() == 1 })
	e.admin.Del(ctx, "lockstep:{lock:order:lost}")
	e.waitState("lost", asynq.TaskStateArchived, 10*time.Second)

	got := map[string]execution{}
	for _, x := range readExecutions(t, e.admin) {
		got[x["order_id"]] = x
		keys := slices.Sorted(maps.Keys(x))
		if want := []string{"fence", "finished_ms", "order_id", "outcome", "started_ms", "task_id", "worker"}; !slices.Equal(keys, want) {
			t.Errorf("entry fields %v, want %v", keys, want)
		}
	}
	for order, outcome := range map[string]string{"ok": OutcomeOK, "stale": OutcomeFenceRejected, "lost": OutcomeLockLost} {
		x := got[order]
		if x["outcome"] != outcome || x["worker"] != "test-worker" {
			t.Errorf("order %s: %v, want outcome %s by test-worker", order, x, outcome)
		}
		fence, _ := strconv.ParseInt(x["fence"], 10, 64)
		started, _ := strconv.ParseInt(x["started_ms"], 10, 64)
		finished, _ := strconv.ParseInt(x["finished_ms"], 10, 64)
		if fence <= 0 || started <= 0 || finished < started {
			t.Errorf("order %s: fence %d, started %d, finished %d", order, fence, started, finished)
		}
	}
	if w := got["ok"]; w["fence"] != e.admin.HGet(ctx, DemoStore("lockstep:", "ok"), "fence").Val() {
		t.Errorf("the store's fence is not the ok execution's %s", w["fence"])
	}
}
