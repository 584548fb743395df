package jobs

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Contention, in three moves:
//
//  1. A task finds its lock busy: requeue counts the contention and adds the
//     task to the resource's waiters, then asynq puts the task in its retry
//     set (no failure) for the backoff.
//  2. The holder releases the lock: wake takes the longest waiting task and
//     moves it from the retry set to the head of its queue at once.
//  3. A wake-up that is lost (the waker crashed, the waiter was still on its
//     way to the retry set) costs only time: the backoff brings the task
//     back anyway.
//
// So a hot resource passes from one job to the next without idling for a
// backoff, and no worker waits on a busy lock.

// maxWakeTries bounds the waiters one release looks at: it skips waiters
// that are gone or not yet in the retry set.
const maxWakeTries = 5

// waiter names a task among a resource's waiters.
func waiter(job Job) string {
	b, _ := json.Marshal([2]string{job.Queue, job.ID})
	return string(b)
}

// waitersKey is the zset of tasks waiting for resource; it shares the lock's
// hash tag.
func (s *Server) waitersKey(resource string) string { return s.locker.Key(resource) + ":waiters" }

func (s *Server) contendedKey(job Job) string {
	return s.locker.Key(job.Resource) + ":contended:" + job.Queue + ":" + job.ID
}

// requeue counts the contention, adds the task to the waiters and returns the
// error that has asynq offer it again after the backoff, or sooner when a
// release wakes it.
//
// The backoff is the fallback for a lost wake-up (a holder that crashed or
// whose lock expired wakes no one), so it grows both with the task's
// contentions and with the waiters ahead of it: the first in line comes
// back soon, the hundredth leaves it to its wake-up.
func (s *Server) requeue(ctx context.Context, job Job) error {
	ttl := max(3*s.cfg.Backoff.Max, time.Minute)
	n, ahead := 1, 0
	v, err := run(ctx, s.client, scriptContended,
		[]string{s.contendedKey(job), s.waitersKey(job.Resource)},
		ttl.Milliseconds(), waiter(job), time.Now().UnixMilli())
	if vals, ok := v.([]any); err == nil && ok && len(vals) == 2 {
		c, _ := vals[0].(int64)
		a, _ := vals[1].(int64)
		n, ahead = int(c), int(a)
	} else {
		s.log.Warn("count contention failed; backing off as for the first time", "type", job.Type, "id", job.ID, "err", err)
	}
	d := s.cfg.Backoff.Nth(n + ahead)
	s.log.Debug("lock busy; task requeued", "type", job.Type, "id", job.ID, "resource", job.Resource,
		"contended", n, "ahead", ahead, "delay", d)
	return &ContendedError{Resource: job.Resource, Count: n, Delay: d}
}

// wake offers the longest waiting task for resource again now; job has just
// released the lock and waits no more.
func (s *Server) wake(ctx context.Context, job Job) {
	key := s.waitersKey(job.Resource)
	var active []redis.Z // on their way to the retry set: put back afterwards
	defer func() {
		if len(active) > 0 {
			s.client.ZAddNX(ctx, key, active...)
		}
	}()
	self := waiter(job)
	for range maxWakeTries {
		v, err := run(ctx, s.client, scriptNextWaiter, []string{key}, self)
		self = ""
		pair, _ := v.([]any)
		if err != nil || len(pair) != 2 {
			return
		}
		member, _ := pair[0].(string)
		var w [2]string
		if json.Unmarshal([]byte(member), &w) != nil {
			continue
		}
		queue, id := w[0], w[1]
		moved, err := run(ctx, s.client, scriptWake, asynqTaskKeys(queue, id), id, time.Now().UnixNano())
		switch {
		case moved == int64(1):
			s.log.Debug("woke a task waiting for the lock", "resource", job.Resource, "id", id)
			return
		case err != nil, moved == int64(-1):
			score, _ := pair[1].(string)
			f, _ := strconv.ParseFloat(score, 64)
			active = append(active, redis.Z{Score: f, Member: member})
			if err != nil {
				return
			}
		}
	}
}

// asynqTaskKeys are the keys of wake.lua: the task's hash, its queue's retry
// set and pending list, in asynq v0.26's layout (internal/base).
func asynqTaskKeys(queue, id string) []string {
	prefix := "asynq:{" + queue + "}:"
	return []string{prefix + "t:" + id, prefix + "retry", prefix + "pending"}
}
