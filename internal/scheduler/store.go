package scheduler

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/overlap"
	"github.com/lockstep-dev/lockstep/internal/script"
	"github.com/lockstep-dev/lockstep/internal/tracing"
)

// Errors of the Store.
var (
	ErrNotFound     = errors.New("no such schedule")
	ErrExists       = errors.New("schedule exists already")
	ErrFileSchedule = errors.New("schedule is defined in the config file")
	// ErrSkippedOverlap: a trigger that the schedule's overlap policy
	// skipped, because an earlier run is queued or running.
	ErrSkippedOverlap = errors.New("skipped: an earlier run is queued or running (overlap policy)")
)

// Store holds the run-time schedules in Redis. Every change is one script
// that also increments a version and publishes it, so that every replica
// applies it at once (and a replica that missed the notice, at its next
// resync). A Store is safe for concurrent use and does not need a running
// scheduler, except that only replicas enqueue cron ticks.
type Store struct {
	client redis.UniversalClient
	prefix string
	k      storeKeys
	enq    *asynq.Client
	runs   *lock.Locker    // the schedules' run locks (internal/overlap)
	trace  *tracing.Tracer // nil: Trigger makes no spans of its own
}

// NewStore returns the store of run-time schedules under prefix (""
// means "lockstep:").
func NewStore(client redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = "lockstep:"
	}
	return &Store{client: client, prefix: prefix, k: storeKeysFor(prefix), enq: asynq.NewClientFromRedisClient(client),
		runs: lock.New(client, lock.WithPrefix(prefix))}
}

// Traced makes Trigger trace with tp: a lockstep.tick span (replica
// "trigger") and its enqueue, whose context goes in the task's headers. It
// returns st.
func (st *Store) Traced(tp trace.TracerProvider) *Store {
	st.trace = tracing.New(tp)
	return st
}

// storedDef is a schedule as stored in Redis.
type storedDef struct {
	Name       string          `json:"name"`
	Cron       string          `json:"cron"`
	Timezone   string          `json:"timezone"`
	Task       string          `json:"task"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Queue      string          `json:"queue"`
	MaxRetry   int             `json:"max_retry"`
	Timeout    string          `json:"timeout,omitempty"`
	CatchUp    string          `json:"catch_up"`
	MaxCatchUp int             `json:"max_catch_up,omitempty"`
	Overlap    string          `json:"overlap,omitempty"` // "" (stored before overlap existed): allow
}

func encodeDef(s config.Schedule) string {
	d := storedDef{Name: s.Name, Cron: s.Cron, Timezone: s.Timezone, Task: s.Task, Payload: s.Payload,
		Queue: s.Queue, MaxRetry: s.MaxRetry, CatchUp: string(s.CatchUp), MaxCatchUp: s.MaxCatchUp, Overlap: string(s.Overlap)}
	if s.Timeout > 0 {
		d.Timeout = s.Timeout.String()
	}
	b, _ := json.Marshal(d)
	return string(b)
}

func decodeDef(raw string) (config.Schedule, error) {
	var d storedDef
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		return config.Schedule{}, err
	}
	s := config.Schedule{Name: d.Name, Cron: d.Cron, Timezone: d.Timezone, Task: d.Task, Payload: d.Payload,
		Queue: d.Queue, MaxRetry: d.MaxRetry, CatchUp: config.CatchUp(d.CatchUp), MaxCatchUp: d.MaxCatchUp,
		Overlap: cmp.Or(config.Overlap(d.Overlap), config.OverlapAllow)}
	if d.Timeout != "" {
		t, err := time.ParseDuration(d.Timeout)
		if err != nil {
			return config.Schedule{}, err
		}
		s.Timeout = t
	}
	return s, nil
}

// meta is what the store keeps beside a definition.
type meta struct {
	Since     int64  `json:"since"`
	Paused    bool   `json:"paused"`
	Spec      string `json:"spec"`
	UpdatedMS int64  `json:"updated_ms"`
	PausedMS  int64  `json:"paused_ms,omitempty"`  // the last pause, Redis ms (pause.lua)
	ResumedMS int64  `json:"resumed_ms,omitempty"` // the last resume, Redis ms
}

// Add stores a new run-time schedule after validating it as a config file's
// entry (CheckSchedule); it fails with ErrExists if the name is taken by a
// run-time schedule, ErrFileSchedule by a file schedule that a replica runs.
func (st *Store) Add(ctx context.Context, s config.Schedule) error { return st.put(ctx, s, "add") }

// Update replaces a run-time schedule (ErrNotFound if there is none). A
// changed cron or time zone takes effect now: ticks of the new spec before
// the change are not due, and none is replayed. Paused stays as it was.
func (st *Store) Update(ctx context.Context, s config.Schedule) error {
	return st.put(ctx, s, "update")
}

func (st *Store) put(ctx context.Context, s config.Schedule, mode string) error {
	if err := CheckSchedule(&s); err != nil {
		return err
	}
	res, err := runSlice(ctx, st.client, scriptPut, []string{st.k.defs, st.k.meta, st.k.version, st.k.file},
		s.Name, encodeDef(s), s.Cron+"\n"+s.Timezone, mode, st.k.channel)
	if err != nil {
		return fmt.Errorf("schedules: %s %s: %w", mode, s.Name, err)
	}
	if len(res) == 2 && res[0] == int64(1) {
		return nil
	}
	reason := ""
	if len(res) == 2 {
		reason, _ = res[1].(string)
	}
	switch reason {
	case "exists":
		return fmt.Errorf("schedules: add %s: %w", s.Name, ErrExists)
	case "missing":
		return fmt.Errorf("schedules: update %s: %w", s.Name, ErrNotFound)
	case "file":
		return fmt.Errorf("schedules: add %s: %w", s.Name, ErrFileSchedule)
	}
	return fmt.Errorf("schedules: %s %s: unexpected reply %v", mode, s.Name, res)
}

// Remove deletes a run-time schedule (ErrNotFound if there is none). Its
// watermark stays, so a schedule added again under its name claims no tick twice.
func (st *Store) Remove(ctx context.Context, name string) error {
	res, err := runSlice(ctx, st.client, scriptRemove, []string{st.k.defs, st.k.meta, st.k.version}, name, st.k.channel)
	if err != nil {
		return fmt.Errorf("schedules: remove %s: %w", name, err)
	}
	if len(res) == 0 || res[0] != int64(1) {
		return fmt.Errorf("schedules: remove %s: %w", name, ErrNotFound)
	}
	return nil
}

// SetPaused pauses or resumes a schedule, run-time or file (a file schedule
// is known from the replicas' registry, or from isFile when the caller read
// the config). It reports whether anything changed. A resumed schedule's
// ticks missed while it was paused follow its catch-up policy.
func (st *Store) SetPaused(ctx context.Context, name string, paused, isFile bool) (changed bool, err error) {
	op := map[bool]string{true: "pause", false: "resume"}[paused]
	res, err := runSlice(ctx, st.client, scriptPause, []string{st.k.defs, st.k.meta, st.k.version, st.k.file},
		name, b01(paused), st.k.channel, b01(isFile))
	if err != nil {
		return false, fmt.Errorf("schedules: %s %s: %w", op, name, err)
	}
	switch {
	case len(res) == 0 || res[0] == int64(0):
		return false, fmt.Errorf("schedules: %s %s: %w", op, name, ErrNotFound)
	case res[0] == int64(2):
		return false, nil
	}
	return true, nil
}

func b01(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// TriggerTaskID is the asynq task id of a tick triggered by hand:
// "<schedule>:trigger:<unix ms>-<random hex>". Cron ticks' ids are
// "<schedule>:<unix seconds>", so the two never collide.
func TriggerTaskID(schedule string, at time.Time) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return schedule + ":trigger:" + strconv.FormatInt(at.UnixMilli(), 10) + "-" + hex.EncodeToString(b)
}

// Trigger enqueues one task of the schedule now, paused or not, with a
// TriggerTaskID, and returns that id. It follows the schedule's overlap
// policy as a tick does: skipped, it fails with ErrSkippedOverlap (recorded
// skipped, reason overlap). The schedule is looked up among the
// run-time schedules, then file (the caller's, from its config), then in the
// replicas' registry of file schedules.
func (st *Store) Trigger(ctx context.Context, name string, file []config.Schedule) (string, error) {
	s, _, err := st.lookup(ctx, name, file)
	if err != nil {
		return "", fmt.Errorf("schedules: trigger %s: %w", name, err)
	}
	now := time.Now()
	id := TriggerTaskID(name, now)
	if s.Overlap != "" && s.Overlap != config.OverlapAllow {
		d, err := overlap.Tick(ctx, st.client, asynq.NewInspectorFromRedisClient(st.client), st.runs, overlap.KeysFor(st.prefix, name),
			keysFor(st.prefix, name).state, s.Overlap, s.Queue, id, backfillGrace, minStateTTL)
		if err != nil {
			return "", fmt.Errorf("schedules: trigger %s: %w", name, err)
		}
		if !d.Run {
			st.record(ctx, name, tickRecord{Tick: time.Now().Unix(), State: TickSkipped, Reason: ReasonOverlap, TaskID: id, Leader: "trigger"})
			return "", fmt.Errorf("schedules: trigger %s: %w", name, ErrSkippedOverlap)
		}
	}
	opts := []asynq.Option{asynq.TaskID(id), asynq.Queue(s.Queue), asynq.MaxRetry(s.MaxRetry)}
	if s.Timeout > 0 {
		opts = append(opts, asynq.Timeout(s.Timeout))
	}
	// tracing: a tick of its own when traced, else the caller's context
	ctx, tick := st.trace.StartTick(ctx, name, now, "trigger")
	defer tick.End()
	ctx, span, headers := st.trace.StartEnqueue(ctx, s.Queue, id)
	defer span.End()
	if headers == nil {
		headers = tracing.Inject(ctx)
	}
	headers = overlap.WithHeaders(headers, name, s.Overlap)
	if _, err := st.enq.EnqueueContext(ctx, asynq.NewTaskWithHeaders(s.Task, s.Payload, headers), opts...); err != nil {
		span.Fail(err)
		tick.Fail(err)
		return "", fmt.Errorf("schedules: trigger %s: %w", name, err)
	}
	tick.Outcome(tracing.TickEnqueued)
	st.record(ctx, name, tickRecord{Tick: time.Now().Unix(), State: TickDone, TaskID: id, Leader: "trigger"})
	return id, nil
}

// lookup finds a schedule's definition and source.
func (st *Store) lookup(ctx context.Context, name string, file []config.Schedule) (config.Schedule, string, error) {
	raw, err := st.client.HGet(ctx, st.k.defs, name).Result()
	if err == nil {
		s, err := decodeDef(raw)
		return s, SourceRuntime, err
	} else if !errors.Is(err, redis.Nil) {
		return config.Schedule{}, "", err
	}
	if i := slices.IndexFunc(file, func(s config.Schedule) bool { return s.Name == name }); i >= 0 {
		return file[i], SourceFile, nil
	}
	raw, err = st.client.HGet(ctx, st.k.file, name).Result()
	if errors.Is(err, redis.Nil) {
		return config.Schedule{}, "", ErrNotFound
	} else if err != nil {
		return config.Schedule{}, "", err
	}
	s, err := decodeDef(raw)
	return s, SourceFile, err
}

// snapshot is the stored state of all run-time schedules at one version.
type snapshot struct {
	version int64
	defs    map[string]string
	meta    map[string]meta
}

// load reads every run-time schedule and the version, atomically.
func (st *Store) load(ctx context.Context) (snapshot, error) {
	var ver *redis.StringCmd
	var defs, metas *redis.MapStringStringCmd
	_, err := st.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, st.k.version)
		defs = p.HGetAll(ctx, st.k.defs)
		metas = p.HGetAll(ctx, st.k.meta)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return snapshot{}, err
	}
	snap := snapshot{defs: defs.Val(), meta: map[string]meta{}}
	snap.version, _ = ver.Int64()
	for name, raw := range metas.Val() {
		var m meta
		if json.Unmarshal([]byte(raw), &m) == nil {
			snap.meta[name] = m
		}
	}
	return snap, nil
}

// version returns the store's change counter.
func (st *Store) version(ctx context.Context) (int64, error) {
	v, err := st.client.Get(ctx, st.k.version).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// registerFile records the file schedules replica id runs, so that the API
// can list, pause and trigger them without the config file, and removes from
// the registry those that no live replica declares (they were in the config
// of replicas that are gone). A replica's declaration lives as long as its
// heartbeat (replicas.lua prunes the registry when one is gone).
func (st *Store) registerFile(ctx context.Context, id string, file []*entry) error {
	args := make([]any, 0, 3+2*len(file))
	args = append(args, id, 10*replicaExpiry.Milliseconds(), st.k.declared)
	for _, e := range file {
		args = append(args, e.name, encodeDef(e.def))
	}
	_, err := script.Run(ctx, st.client, scriptRegister, "", []string{st.k.file, st.k.declared + id, st.k.replicas}, args...)
	return err
}

// Info is one schedule as List reports it.
type Info struct {
	Schedule config.Schedule
	Paused   bool
	Source   string    // SourceFile or SourceRuntime
	LastTick time.Time // the watermark: the latest tick claimed or skipped; zero if none
	NextTick time.Time // the next tick due; zero when paused or there is none
	// Running is the task id of the schedule's running run (overlap policies
	// other than allow: its worker holds the run lock), "" if none.
	Running string
	// Queued is how many of its runs are recorded queued (waiting, or to be
	// retried), as of the last tick's check.
	Queued int
}

// List returns every schedule by name: the run-time ones and the file ones
// (file, from the caller's config; without one, the replicas' registry). A
// file schedule shadows a run-time one of the same name, as on the replicas.
func (st *Store) List(ctx context.Context, file []config.Schedule) ([]Info, error) {
	snap, err := st.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	if file == nil {
		reg, err := st.client.HGetAll(ctx, st.k.file).Result()
		if err != nil {
			return nil, fmt.Errorf("schedules: list: %w", err)
		}
		for _, raw := range reg {
			if s, err := decodeDef(raw); err == nil {
				file = append(file, s)
			}
		}
	}
	byName := map[string]Info{}
	for name, raw := range snap.defs {
		s, err := decodeDef(raw)
		if err != nil {
			continue
		}
		byName[name] = Info{Schedule: s, Paused: snap.meta[name].Paused, Source: SourceRuntime}
	}
	for _, s := range file {
		byName[s.Name] = Info{Schedule: s, Paused: snap.meta[s.Name].Paused, Source: SourceFile}
	}
	names := slices.Sorted(maps.Keys(byName))
	cmds := make([]*redis.StringCmd, len(names))
	runs := make([]*redis.MapStringStringCmd, len(names))
	locked := make([]*redis.IntCmd, len(names))
	_, err = st.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			cmds[i] = p.HGet(ctx, keysFor(st.prefix, name).state, "tick")
			if o := byName[name].Schedule.Overlap; o != "" && o != config.OverlapAllow {
				k := overlap.KeysFor(st.prefix, name)
				runs[i], locked[i] = p.HGetAll(ctx, k.Runs), p.Exists(ctx, k.Lock)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("schedules: list: %w", err)
	}
	now := time.Now()
	out := make([]Info, 0, len(names))
	for i, name := range names {
		in := byName[name]
		if u, err := cmds[i].Int64(); err == nil {
			in.LastTick = time.Unix(u, 0).UTC()
		}
		if runs[i] != nil {
			for id, v := range runs[i].Val() {
				if v == "r" && locked[i].Val() == 1 {
					in.Running = id
				} else if strings.HasPrefix(v, "q") {
					in.Queued++
				}
			}
		}
		if !in.Paused {
			from := now
			if since := snap.meta[name].Since; in.Source == SourceRuntime && since > now.Unix() {
				from = time.Unix(since, 0)
			}
			loc, err := time.LoadLocation(in.Schedule.Timezone)
			if err != nil {
				loc = time.UTC
			}
			if spec, err := ParseSpec(in.Schedule.Cron, loc); err == nil {
				in.NextTick = spec.Next(from)
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// Get returns one schedule as List would (ErrNotFound if there is none).
func (st *Store) Get(ctx context.Context, name string, file []config.Schedule) (Info, error) {
	all, err := st.List(ctx, file)
	if err != nil {
		return Info{}, err
	}
	if i := slices.IndexFunc(all, func(in Info) bool { return in.Schedule.Name == name }); i >= 0 {
		return all[i], nil
	}
	return Info{}, fmt.Errorf("schedules: %s: %w", name, ErrNotFound)
}

// runSlice runs a script through the one runner (internal/script) and
// returns its array reply; callers name the operation in their errors.
func runSlice(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) ([]any, error) {
	v, err := script.Run(ctx, c, s, "", keys, args...)
	if err != nil {
		return nil, err
	}
	a, _ := v.([]any)
	return a, nil
}
