package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/jobs"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// The third demo job, demo:api.call, calls a partner's API for a client:
// work_ms of work under the client's quota, RatedLimit per client (a rate
// limit, no lock). Each run records its start, with the time its rate
// admitted it, in RatedStream before it works, so that a checker bounds the
// starts per client (G11) even of runs a fault cut short.
const RatedType = "demo:api.call"

// RatedLimit is a client's quota: 2 calls a second, 2 at once.
var RatedLimit = lock.Rate{N: 2, Per: time.Second, Burst: 2}

// RatedPayload is demo:api.call's payload, e.g. {"client_id":"c1","work_ms":50}.
type RatedPayload struct {
	ClientID string `json:"client_id"`
	WorkMS   int64  `json:"work_ms"`
}

// RatedKey is the rate key of a client's calls.
func RatedKey(clientID string) string { return "rate:client:" + clientID }

// RatedStream is the stream of demo:api.call starts under prefix: client_id,
// task_id, worker, admitted_us (the rate's admission, Redis's clock) and
// started_us (the handler's start, the worker's clock).
func RatedStream(prefix string) string { return prefix + "demo:api.calls" }

// RatedSpec returns demo:api.call for a worker: its records name workerID.
func RatedSpec(client redis.UniversalClient, prefix, workerID string) jobs.Spec {
	return jobs.Spec{
		Type:   RatedType,
		Decode: DecodeRated,
		Rate: func(p any) (string, lock.Rate) {
			return RatedKey(p.(RatedPayload).ClientID), RatedLimit
		},
		Run: func(ctx context.Context, j jobs.Job, payload any) error {
			p := payload.(RatedPayload)
			started := time.Now()
			if err := client.XAdd(ctx, &redis.XAddArgs{Stream: RatedStream(prefix), MaxLen: streamLen, Approx: true,
				Values: []any{"client_id", p.ClientID, "task_id", j.ID, "worker", workerID,
					"admitted_us", strconv.FormatInt(j.Admitted.UnixMicro(), 10), "started_us", strconv.FormatInt(started.UnixMicro(), 10)},
			}).Err(); err != nil {
				return fmt.Errorf("demo: record call: %w", err)
			}
			work := time.NewTimer(time.Duration(p.WorkMS) * time.Millisecond)
			defer work.Stop()
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-work.C:
				return nil
			}
		},
	}
}

// DecodeRated reads and checks a demo:api.call payload.
func DecodeRated(b []byte) (any, error) {
	var p RatedPayload
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	if err := checkPayload("client_id", p.ClientID, "{}", p.WorkMS); err != nil {
		return nil, err
	}
	return p, nil
}

// RatedStart is one entry of RatedStream.
type RatedStart struct {
	ClientID string
	TaskID   string
	Worker   string
	Admitted time.Time // zero when the run had no admission
	Started  time.Time
}

// ReadRatedStarts returns every entry of RatedStream, oldest first.
func ReadRatedStarts(ctx context.Context, c redis.UniversalClient, prefix string) ([]RatedStart, error) {
	return readStream(ctx, c, RatedStream(prefix), func(_ string, f fields) RatedStart {
		s := RatedStart{ClientID: f.s("client_id"), TaskID: f.s("task_id"), Worker: f.s("worker"), Started: time.UnixMicro(f.n("started_us"))}
		if us := f.n("admitted_us"); us > 0 {
			s.Admitted = time.UnixMicro(us)
		}
		return s
	})
}
