package asynqstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// PipelineEnqueues returns client for an asynq.Client whose enqueues go
// through send instead of one round trip each: send puts the command in a
// pipeline of its own and returns once the command holds its reply, or
// returns an error when it gave up waiting (then the caller gets a command
// failed with that error, as the one handed over may still be in flight).
// Everything else goes to client as it is.
//
// asynq's client (v0.26.0) enqueues with EVALSHA of its own scripts
// (enqueue, enqueueUnique, schedule, scheduleUnique, addToGroup...); every
// EVALSHA is handed to send, built as go-redis builds it (argument
// flattening, first key position). The EVAL that redis.Script.Run sends
// after a NOSCRIPT reply goes to client directly.
func PipelineEnqueues(client redis.UniversalClient, send func(ctx context.Context, cmd *redis.Cmd) error) redis.UniversalClient {
	return pipelinedEnqueues{UniversalClient: client, send: send}
}

type pipelinedEnqueues struct {
	redis.UniversalClient
	send func(context.Context, *redis.Cmd) error
}

func (p pipelinedEnqueues) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	// A pipeline that is never executed builds the command exactly as
	// go-redis does.
	cmd := p.UniversalClient.Pipeline().EvalSha(ctx, sha1, keys, args...)
	if err := p.send(ctx, cmd); err != nil {
		failed := redis.NewCmd(ctx)
		failed.SetErr(err)
		return failed
	}
	return cmd
}
