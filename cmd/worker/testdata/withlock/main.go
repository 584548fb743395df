// Command withlock is a user's program that locks a piece of its own code
// with lockstep.WithLock, for the worker's process tests: it waits for key
// (on LOCKSTEP_REDIS_ADDR) as docs/locking.md shows, holds
// it for -hold, and prints one JSON line per event (waiting, acquired,
// released) with the server-independent wall clock in Unix ms and the fence.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
)

func main() {
	key := flag.String("key", "lock:order:mix", "the lock's key")
	ttl := flag.Duration("ttl", 5*time.Second, "the lock's TTL")
	wait := flag.Duration("wait", 40*time.Second, "how long to wait for the lock")
	hold := flag.Duration("hold", 100*time.Millisecond, "how long to hold it")
	flag.Parse()

	client := redis.NewClient(&redis.Options{Addr: os.Getenv("LOCKSTEP_REDIS_ADDR")})
	defer client.Close()
	locker := lockstep.NewLocker(client)
	defer locker.Close(context.Background())

	emit := func(event string, fence int64) {
		b, _ := json.Marshal(map[string]any{"msg": event, "fence": fence, "at_ms": time.Now().UnixMilli()})
		fmt.Println(string(b))
	}
	emit("waiting", 0)
	err := locker.WithLock(context.Background(), *key, func(ctx context.Context, lease *lockstep.Lease) error {
		emit("acquired", lease.Fence())
		select {
		case <-time.After(*hold):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		emit("released", lease.Fence())
		return nil
	}, lockstep.TTL(*ttl), lockstep.Wait(*wait))
	if err != nil {
		fmt.Fprintln(os.Stderr, "withlock:", err)
		os.Exit(1)
	}
}
