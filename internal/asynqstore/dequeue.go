package asynqstore

import (
	"context"
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/script"
)

//go:embed lua/dequeue.lua
var dequeueLua string

var scriptDequeue = script.New("asynqstore/dequeue.lua", dequeueLua)

// RecordDequeues returns client for an asynq server of its own whose every
// dequeue also adds the task's record to the set holds, in the same script
// (lua/dequeue.lua): record(queue, id) is the record, and the task ids that
// JSON would not escape are recorded. The dequeue also writes process (the
// worker's host:pid) into the task: while the task is active it is this
// delivery's, which Recover and Holds tell from a record of it that another
// process kept after the task left its hands. Everything else goes to client
// as it is. On a Cluster, where holds lies in another slot than the queue,
// holds is "" (and record nil): the dequeue only notes the worker.
//
// asynq dequeues with EVALSHA of its own script over the queue's pending,
// paused, active and lease keys (v0.26.0); a call of that shape runs
// dequeue.lua instead, which does what asynq's does and records.
func RecordDequeues(client redis.UniversalClient, holds, process string, record func(queue, id string) string) redis.UniversalClient {
	return recordingClient{UniversalClient: client, holds: holds, process: process, record: record}
}

type recordingClient struct {
	redis.UniversalClient
	holds, process string
	record         func(queue, id string) string
}

func (c recordingClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	queue, ok := dequeueKeys(keys)
	if !ok || len(args) != 2 {
		return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
	}
	keys, before, after := keys[:4:4], "", ""
	if c.holds != "" {
		// The record's text around the id: where the records of ids ""
		// and "a" part.
		empty, one := c.record(queue, ""), c.record(queue, "a")
		i := 0
		for i < len(empty) && empty[i] == one[i] {
			i++
		}
		keys, before, after = append(keys, c.holds), empty[:i], empty[i:]
	}
	v, err := script.Run(ctx, c.UniversalClient, scriptDequeue, "asynq dequeue",
		keys, args[0], args[1], before, after, c.process)
	cmd := redis.NewCmd(ctx)
	if err != nil {
		cmd.SetErr(err)
	} else {
		cmd.SetVal(v)
	}
	return cmd
}

// Recorded reports whether a dequeue through RecordDequeues records the
// task id: JSON leaves it as it is (dequeue.lua's test).
func Recorded(id string) bool {
	return !strings.ContainsFunc(id, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r >= 0x80 || strings.ContainsRune(`"\<>&`, r)
	})
}

// dequeueKeys reports whether keys are those of asynq's dequeue, and of
// which queue.
func dequeueKeys(keys []string) (string, bool) {
	if len(keys) != 4 {
		return "", false
	}
	p, ok := strings.CutSuffix(keys[0], "pending")
	queue := strings.TrimSuffix(strings.TrimPrefix(p, "asynq:{"), "}:")
	if !ok || p != queuePrefix(queue) || keys[1] != p+"paused" || keys[2] != p+"active" || keys[3] != p+"lease" {
		return "", false
	}
	return queue, true
}
