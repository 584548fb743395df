package schedules

import (
	"cmp"
	"context"
	"encoding/json"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/scheduler"
)

// Schedule is one cron schedule. Zero fields take the defaults of a config
// file's entry: Timezone UTC, Queue "default", MaxRetry 5 (set NoRetry for
// 0), CatchUp "skip", Overlap "allow", MaxCatchUp the replicas' scheduler.max_catch_up.
type Schedule struct {
	Name     string          // [A-Za-z0-9_.-]+
	Cron     string          // 5 or 6 fields (seconds first), descriptors, "@every D"
	Timezone string          // an IANA zone
	Task     string          // asynq task type
	Payload  json.RawMessage // a JSON object, or nil
	Queue    string
	MaxRetry int
	NoRetry  bool          // MaxRetry 0
	Timeout  time.Duration // 0: asynq's default
	CatchUp  string        // skip, once or all
	// MaxCatchUp caps the ticks CatchUp "all" enqueues after an outage or a pause.
	MaxCatchUp int
	// Overlap is what a tick does while an earlier run of the schedule is
	// queued or running: allow (the default), skip, buffer_one or
	// cancel_previous (see docs/scheduler.md).
	Overlap string
}

// Info is a schedule as List reports it.
type Info struct {
	Schedule
	Paused   bool
	Source   string    // "file" or "runtime"
	LastTick time.Time // the watermark: the latest tick claimed or skipped; zero if none
	NextTick time.Time // zero when paused
}

var (
	// ErrNotFound: no schedule of that name.
	ErrNotFound = scheduler.ErrNotFound
	// ErrExists: Add of a name a run-time schedule has.
	ErrExists = scheduler.ErrExists
	// ErrFileSchedule: Add of a name a file schedule has.
	ErrFileSchedule = scheduler.ErrFileSchedule
	// ErrSkippedOverlap: Trigger skipped by the schedule's overlap policy.
	ErrSkippedOverlap = scheduler.ErrSkippedOverlap
)

// FieldError is one problem with one field of a schedule that Add or
// Update refused, e.g. `schedule (acme).cron: invalid cron expression ...`,
// the same message as for a config file's entry. Several are joined; use
// errors.As to get the first.
type FieldError = config.Error

// Client changes the run-time schedules in one Redis deployment.
type Client struct{ st *scheduler.Store }

// Option configures a Client.
type Option func(*options)

type options struct{ prefix string }

// WithPrefix sets the key prefix (default "lockstep:"), as lock.prefix in
// the scheduler's config.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// New returns a client over redisClient (single, Sentinel or Cluster).
func New(redisClient redis.UniversalClient, opts ...Option) *Client {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return &Client{st: scheduler.NewStore(redisClient, o.prefix)}
}

// Add stores a new schedule. A bad one is refused with the config file's
// messages (*FieldError, naming the field), and nothing is stored.
func (c *Client) Add(ctx context.Context, s Schedule) error { return c.st.Add(ctx, s.internal()) }

// Update replaces a run-time schedule; see the package documentation for
// what a changed cron does to its ticks.
func (c *Client) Update(ctx context.Context, s Schedule) error {
	return c.st.Update(ctx, s.internal())
}

// Remove deletes a run-time schedule.
func (c *Client) Remove(ctx context.Context, name string) error { return c.st.Remove(ctx, name) }

// Pause stops a schedule's ticks on every replica; it reports false if the
// schedule was paused already.
func (c *Client) Pause(ctx context.Context, name string) (bool, error) {
	return c.st.SetPaused(ctx, name, true, false)
}

// Resume restarts a paused schedule; its ticks missed meanwhile follow its
// catch-up policy. It reports false if the schedule was not paused.
func (c *Client) Resume(ctx context.Context, name string) (bool, error) {
	return c.st.SetPaused(ctx, name, false, false)
}

// Trigger enqueues one task of the schedule now and returns its task id,
// "<schedule>:trigger:<unix ms>-<random hex>". The trace context of ctx, if
// any, goes in the task's headers: the worker's job span joins that trace.
// It follows the schedule's overlap policy: skipped, it returns
// ErrSkippedOverlap.
func (c *Client) Trigger(ctx context.Context, name string) (string, error) {
	return c.st.Trigger(ctx, name, nil)
}

// List returns every schedule, run-time and file, by name.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	all, err := c.st.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(all))
	for i, in := range all {
		out[i] = fromInfo(in)
	}
	return out, nil
}

// Get returns one schedule.
func (c *Client) Get(ctx context.Context, name string) (Info, error) {
	in, err := c.st.Get(ctx, name, nil)
	if err != nil {
		return Info{}, err
	}
	return fromInfo(in), nil
}

func (s Schedule) internal() config.Schedule {
	d := config.NewSchedule()
	d.Name, d.Cron, d.Task, d.Payload, d.Timeout, d.MaxCatchUp = s.Name, s.Cron, s.Task, s.Payload, s.Timeout, s.MaxCatchUp
	d.Timezone = cmp.Or(s.Timezone, d.Timezone)
	d.Queue = cmp.Or(s.Queue, d.Queue)
	d.CatchUp = cmp.Or(config.CatchUp(s.CatchUp), d.CatchUp)
	d.Overlap = cmp.Or(config.Overlap(s.Overlap), d.Overlap)
	if s.MaxRetry != 0 || s.NoRetry {
		d.MaxRetry = s.MaxRetry
	}
	return d
}

func fromInfo(in scheduler.Info) Info {
	s := in.Schedule
	return Info{
		Schedule: Schedule{Name: s.Name, Cron: s.Cron, Timezone: s.Timezone, Task: s.Task, Payload: s.Payload,
			Queue: s.Queue, MaxRetry: s.MaxRetry, NoRetry: s.MaxRetry == 0, Timeout: s.Timeout,
			CatchUp: string(s.CatchUp), MaxCatchUp: s.MaxCatchUp, Overlap: string(s.Overlap)},
		Paused: in.Paused, Source: in.Source, LastTick: in.LastTick, NextTick: in.NextTick,
	}
}

// Results of a backfilled tick (BackfillTick.Result).
const (
	BackfillEnqueued  = scheduler.BackfillEnqueued  // enqueued now
	BackfillExists    = scheduler.BackfillExists    // its task was enqueued already, by the scheduler or a backfill
	BackfillSkipped   = scheduler.BackfillSkipped   // skipped by the overlap policy (recorded skipped, reason overlap)
	BackfillScheduler = scheduler.BackfillScheduler // not yet due to the scheduler's watermark: the scheduler enqueues it
	BackfillWould     = scheduler.BackfillWould     // dry run: would be enqueued
)

// ErrBadBackfill: a backfill refused as a whole (a range after now, from
// after to, older than task_retention, more than Max ticks); nothing was
// enqueued.
var ErrBadBackfill = scheduler.ErrBadBackfill

// BackfillOptions bound and direct Backfill.
type BackfillOptions = scheduler.BackfillOptions

// BackfillTick is one tick of a backfill.
type BackfillTick = scheduler.BackfillTick

// Backfill enqueues each tick of the schedule in [from, to] that was not
// enqueued yet, once, with the tick's own task id "<schedule>:<unix
// seconds>", applying the schedule's overlap policy, and returns every
// tick of the range with its result. Ticks newer than the schedule's
// latest claimed tick are left to the scheduler. It refuses with
// ErrBadBackfill, before enqueuing anything, a range that reaches into the
// future or further back than task_retention, or that holds more than
// opts.Max ticks (default 1000).
func (c *Client) Backfill(ctx context.Context, name string, from, to time.Time, opts BackfillOptions) ([]BackfillTick, error) {
	return c.st.Backfill(ctx, name, nil, from, to, opts)
}
