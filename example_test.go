package lockstep_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep"
)

// Lock a piece of code that is not a job: one replica rebuilds the cache, the
// others skip or wait. The fence lets the store refuse a stale writer.
func ExampleLocker_WithLock() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locker := lockstep.NewLocker(client)
	defer locker.Close(context.Background())

	err := locker.WithLock(context.Background(), "cache:rebuild", func(ctx context.Context, lease *lockstep.Lease) error {
		// ctx is cancelled if the lock is lost; pass lease.Fence() to the store.
		return rebuildCache(ctx, lease.Fence())
	}, lockstep.TTL(30*time.Second), lockstep.Wait(time.Minute))
	if err != nil {
		log.Print(err)
	}
}

func rebuildCache(ctx context.Context, fence int64) error { return ctx.Err() }

// Allow: at most 100 events a second to a partner, across every process;
// wait the time Allow gives and ask again.
func ExampleLocker_Allow() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locker := lockstep.NewLocker(client)
	defer locker.Close(context.Background())
	ctx := context.Background()

	for _, event := range events {
		for {
			wait, err := locker.Allow(ctx, "api:partner-42", lockstep.RateLimit{N: 100, Per: time.Second})
			if err != nil {
				log.Fatal(err)
			}
			if wait == 0 {
				break
			}
			time.Sleep(wait)
		}
		send(event)
	}
}

func ExampleLocker_WaitAllow() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locker := lockstep.NewLocker(client)
	defer locker.Close(context.Background())
	ctx := context.Background()

	for _, event := range events {
		// Over the rate, this waits for its turn, taken in arrival order.
		if err := locker.WaitAllow(ctx, "api:partner-42", lockstep.RateLimit{N: 100, Per: time.Second}); err != nil {
			log.Fatal(err)
		}
		send(event)
	}
}

var events []string

func send(string) {}
