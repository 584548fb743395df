package jobs

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Lost locks are also recorded in a short stream, so that an operator sees
// the recent ones with their reason (lockstep ui) without a log search.
const (
	lossesLen     = 1000            // entries kept, approximately
	lossesTimeout = 1 * time.Second // a loss because Redis is unreachable must not hold the task long
)

// The stream of recent lock losses is Locker.LossesKey: entries with
// resource, reason, fence, holder, task_id, type, queue, at_ms.

// recordLoss adds a lost lock to the stream, best effort.
func (s *Server) recordLoss(ctx context.Context, job Job, lease *lock.Lease, lost error) {
	reason := "unknown"
	if le, ok := errors.AsType[*lock.LostError](lost); ok {
		reason = string(le.Reason)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lossesTimeout)
	defer cancel()
	err := s.client.XAdd(ctx, &redis.XAddArgs{
		Stream: lease.Locker().LossesKey(), MaxLen: lossesLen, Approx: true,
		Values: []any{"resource", job.Resource, "reason", reason, "fence", job.Fence, "permit", job.Permit,
			"holder", lock.ParseToken(lease.Token()).Holder, "task_id", job.ID, "type", job.Type,
			"queue", job.Queue, "at_ms", strconv.FormatInt(time.Now().UnixMilli(), 10)},
	}).Err()
	if err != nil {
		s.log.Debug("record lock loss failed", "resource", job.Resource, "err", err)
	}
}
