package schedules_test

import (
	"context"
	"encoding/json"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/schedules"
)

// One schedule per customer, added, paused and triggered while the
// scheduler replicas run; each replica applies every change within a second.
func Example() {
	ctx := context.Background()
	c := schedules.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))

	err := c.Add(ctx, schedules.Schedule{
		Name:     "report-acme",
		Cron:     "0 0 6 * * *", // 06:00:00 every day
		Timezone: "Europe/Berlin",
		Task:     "report:build",
		Payload:  json.RawMessage(`{"customer":"acme"}`),
		CatchUp:  "once", // after an outage or a pause: the latest missed tick
		Overlap:  "skip", // no tick while the previous run is queued or running
	})
	if err != nil {
		log.Fatal(err) // e.g. schedule (report-acme).cron: invalid cron expression ...
	}

	id, err := c.Trigger(ctx, "report-acme") // one run now: "report-acme:trigger:<unix ms>-<hex>"
	if err != nil {
		log.Fatal(err)
	}
	log.Println("enqueued", id)

	if _, err := c.Pause(ctx, "report-acme"); err != nil {
		log.Fatal(err)
	}

	// Yesterday's ticks that were not enqueued (the schedule did not exist
	// yet, or an outage skipped them), each once with its own task id.
	to := time.Now().Add(-time.Hour)
	ticks, err := c.Backfill(ctx, "report-acme", to.Add(-20*time.Hour), to, schedules.BackfillOptions{Max: 100})
	if err != nil {
		log.Fatal(err) // errors.Is(err, schedules.ErrBadBackfill): a bad range, nothing enqueued
	}
	for _, t := range ticks {
		log.Println(t.Tick, t.TaskID, t.Result) // enqueued, exists, skipped_overlap or scheduler
	}
}

// Add stores a run-time schedule; every scheduler replica runs it within a
// second. A bad schedule is refused, naming the field, and nothing is stored.
func ExampleClient_Add() {
	ctx := context.Background()
	c := schedules.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))

	err := c.Add(ctx, schedules.Schedule{
		Name:     "report-acme",
		Cron:     "0 0 6 * * *", // 06:00:00 every day
		Timezone: "Europe/Berlin",
		Task:     "report:build",
		Payload:  json.RawMessage(`{"customer":"acme"}`),
		CatchUp:  "once", // after an outage or a pause: the latest missed tick
		Overlap:  "skip", // no tick while the previous run is queued or running
	})
	if err != nil {
		log.Fatal(err) // e.g. schedule (report-acme).cron: invalid cron expression ...
	}
}
