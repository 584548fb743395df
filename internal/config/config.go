package config

import (
	"encoding/json"
	"time"

	"github.com/lockstep-dev/lockstep/internal/backoff"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

// Common holds the sections shared by both binaries.
type Common struct {
	Redis RedisConfig `yaml:"redis"`
	HTTP  HTTPConfig  `yaml:"http"`
	Log   LogConfig   `yaml:"log"`
	Lock  LockConfig  `yaml:"lock"`
}

// RedisConfig says how to reach the one Redis deployment that holds all
// shared state: a single server, a Sentinel-managed master or a Cluster.
// After loading, Password holds the contents of PasswordFile when that was set.
type RedisConfig struct {
	Mode             RedisMode     `yaml:"mode"`
	Addr             string        `yaml:"addr"`        // single: host:port, or a unix socket path
	Addrs            []string      `yaml:"addrs"`       // sentinel: the sentinels; cluster: seed nodes
	MasterName       string        `yaml:"master_name"` // sentinel: the monitored master's name
	DB               int           `yaml:"db"`          // cluster: 0 only
	Username         string        `yaml:"username"`
	Password         Secret        `yaml:"password"`
	PasswordFile     string        `yaml:"password_file"`
	SentinelUsername string        `yaml:"sentinel_username"` // sentinel: ACL user of the sentinels, if any
	SentinelPassword Secret        `yaml:"sentinel_password"` // sentinel: password of the sentinels, if any
	TLS              TLSConfig     `yaml:"tls"`
	DialTimeout      time.Duration `yaml:"dial_timeout"`
	ReadTimeout      time.Duration `yaml:"read_timeout"`
	WriteTimeout     time.Duration `yaml:"write_timeout"`
	PoolSize         int           `yaml:"pool_size"` // 0 = go-redis default
}

// RedisMode is the kind of Redis deployment.
type RedisMode string

// The Redis modes.
const (
	RedisSingle   RedisMode = "single"   // one server (or a proxy in front of one master)
	RedisSentinel RedisMode = "sentinel" // a master found through Sentinel, which fails it over
	RedisCluster  RedisMode = "cluster"  // Redis Cluster
)

// TLSConfig enables TLS (to Redis, or to etcd under lock.etcd). The files are PEM; CertFile and KeyFile
// (a client certificate) go together.
type TLSConfig struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// HTTPConfig is the address of the /metrics, /healthz and /readyz server.
type HTTPConfig struct {
	Addr string `yaml:"addr"`
}

// LogConfig selects the slog handler; see NewLogger.
type LogConfig struct {
	Format string `yaml:"format"` // json | text
	Level  string `yaml:"level"`  // debug | info | warn | error
}

// LockConfig holds the lock defaults shared by workers and schedulers.
type LockConfig struct {
	Backend             LockBackend   `yaml:"backend"`
	Nodes               []string      `yaml:"nodes"`        // redlock: independent masters, an odd number
	NodeTimeout         time.Duration `yaml:"node_timeout"` // redlock: 0 = lock package default
	Prefix              string        `yaml:"prefix"`
	TTL                 time.Duration `yaml:"ttl"`
	RenewInterval       time.Duration `yaml:"renew_interval"` // 0 = TTL/3
	DriftMargin         time.Duration `yaml:"drift_margin"`   // 0 = watchdog default
	WaitReplicas        int           `yaml:"wait_replicas"`
	WaitReplicasTimeout time.Duration `yaml:"wait_replicas_timeout"`
	FenceTTL            time.Duration `yaml:"fence_ttl"` // how long a fencing counter outlives its lock; at least DefaultMaxClockSkew
	Etcd                EtcdConfig    `yaml:"etcd"`      // etcd: the cluster that holds the locks
}

// EtcdConfig says how to reach the etcd cluster of lock.backend etcd. Only
// locks live there; the queue and the scheduler's tick claims stay on Redis.
// After loading, Password holds the contents of PasswordFile when that was set.
type EtcdConfig struct {
	Endpoints    []string      `yaml:"endpoints"` // host:port, http://host:port or https://host:port
	Username     string        `yaml:"username"`
	Password     Secret        `yaml:"password"`
	PasswordFile string        `yaml:"password_file"`
	TLS          TLSConfig     `yaml:"tls"`
	DialTimeout  time.Duration `yaml:"dial_timeout"` // 0 = 5s
	// ElectionTimeout is the members' --election-timeout; 0 = 1s, etcd's
	// default. It bounds lock.ttl from below (see MinEtcdTTL).
	ElectionTimeout time.Duration `yaml:"election_timeout"`
}

func (e EtcdConfig) isZero() bool {
	return len(e.Endpoints) == 0 && e.Username == "" && e.Password == "" && e.PasswordFile == "" &&
		e.TLS == (TLSConfig{}) && e.DialTimeout == 0 && e.ElectionTimeout == 0
}

// LockBackend is where locks live.
type LockBackend string

// The lock backends.
const (
	BackendRedis   LockBackend = "redis"   // in the redis section's deployment
	BackendRedlock LockBackend = "redlock" // on a quorum of lock.nodes
	BackendEtcd    LockBackend = "etcd"    // in the etcd cluster of lock.etcd
)

// WorkerConfig is the configuration of cmd/worker (configs/worker.yaml).
type WorkerConfig struct {
	Common `yaml:",inline"`
	Worker WorkerSettings `yaml:"worker"`
	Demo   DemoSettings   `yaml:"demo"`
}

// DemoSettings says where the demo jobs (worker.demo) keep their fenced
// store. Their executions stream stays in Redis either way.
type DemoSettings struct {
	Store DemoStore `yaml:"store"`
	// PostgresDSN reaches the database of demo.store postgres: a URL
	// (postgres://user:password@host:5432/db) or key=value pairs, as pgx
	// reads them. It may hold a password, so it is a Secret.
	PostgresDSN Secret `yaml:"postgres_dsn"`
}

// DemoStore is where the demo jobs' fenced store lives.
type DemoStore string

// The demo stores.
const (
	DemoRedis    DemoStore = "redis"    // Lua scripts in the redis section's deployment
	DemoPostgres DemoStore = "postgres" // PostgreSQL at demo.postgres_dsn, checked with package fence
)

// PostgresDriver is the database/sql driver the worker opens
// demo.postgres_dsn with: pgx's, registered by importing
// github.com/jackc/pgx/v5/stdlib (cmd/worker does).
const PostgresDriver = "pgx"

// WorkerSettings configures the asynq server and the contention requeue.
type WorkerSettings struct {
	Concurrency          int            `yaml:"concurrency"`
	Queues               map[string]int `yaml:"queues"` // queue name -> priority
	StrictPriority       bool           `yaml:"strict_priority"`
	ShutdownTimeout      time.Duration  `yaml:"shutdown_timeout"`
	ContentionBackoffMin time.Duration  `yaml:"contention_backoff_min"`
	ContentionBackoffMax time.Duration  `yaml:"contention_backoff_max"`
	// PollInterval is how often an idle worker looks for new tasks (a lock's
	// release hands on to the next waiter without waiting for it); 0
	// derives it from ContentionBackoffMin (within 20ms..1s).
	PollInterval time.Duration `yaml:"poll_interval"`
	Demo         bool          `yaml:"demo"` // register the built-in demo:order.pay job (default false; cmd/worker registers it with worker.DemoJob)
}

// SchedulerConfig is the configuration of cmd/scheduler (configs/scheduler.yaml).
type SchedulerConfig struct {
	Common    `yaml:",inline"`
	Scheduler SchedulerSettings `yaml:"scheduler"`
	Schedules []Schedule        `yaml:"schedules"`
}

// SchedulerSettings configures the tick claim shared by all schedules.
type SchedulerSettings struct {
	MaxClockSkew  time.Duration `yaml:"max_clock_skew"`
	TickLockTTL   time.Duration `yaml:"tick_lock_ttl"`
	TaskRetention time.Duration `yaml:"task_retention"` // how long tick task ids reject duplicates
	MaxCatchUp    int           `yaml:"max_catch_up"`   // cap for CatchUpAll
}

// Schedule is one cron entry. After loading, Timezone is a valid IANA name
// (default UTC), Payload is a JSON object or nil, and MaxCatchUp is never 0.
// The cron expression itself is checked by the scheduler package.
type Schedule struct {
	Name       string          `yaml:"name"` // [A-Za-z0-9_.-]+, unique; task ids are <name>:<unix>
	Cron       string          `yaml:"cron"`
	Timezone   string          `yaml:"timezone"`
	Task       string          `yaml:"task"`
	Payload    json.RawMessage `yaml:"payload"`
	Queue      string          `yaml:"queue"`
	MaxRetry   int             `yaml:"max_retry"`
	Timeout    time.Duration   `yaml:"timeout"` // 0 = asynq default
	CatchUp    CatchUp         `yaml:"catch_up"`
	MaxCatchUp int             `yaml:"max_catch_up"` // 0 in the file = scheduler.max_catch_up
	Overlap    Overlap         `yaml:"overlap"`
}

// DefaultTaskRetention is scheduler.task_retention's default.
const DefaultTaskRetention = 24 * time.Hour

// Overlap is what a schedule does with a tick while an earlier run of it
// (its task, from enqueue until it completes, fails its last retry or is
// archived) is queued or running.
type Overlap string

// Overlap policies.
const (
	OverlapAllow          Overlap = "allow"           // enqueue every tick (the default)
	OverlapSkip           Overlap = "skip"            // skip the tick while a run is queued or running
	OverlapBufferOne      Overlap = "buffer_one"      // at most one run waits behind the running one
	OverlapCancelPrevious Overlap = "cancel_previous" // cancel the running run (its lock is lost), then run
)

// CatchUp is what a schedule does with ticks missed while no replica ran.
type CatchUp string

// The catch-up policies.
const (
	CatchUpSkip CatchUp = "skip" // enqueue nothing for missed ticks
	CatchUpOnce CatchUp = "once" // enqueue the latest missed tick
	CatchUpAll  CatchUp = "all"  // enqueue every missed tick, up to MaxCatchUp
)

// DefaultMaxClockSkew is scheduler.max_clock_skew's default: the most that
// the clocks of the machines Lockstep runs on (replicas, Redis servers) may
// differ. It is also the floor of lock.fence_ttl, and lock.DefaultFenceTTL,
// in every binary: a fencing counter must outlive its lock by as much as a
// Redis server's clock may be behind the one that handed out the last fence.
const DefaultMaxClockSkew = 2 * time.Second

// DefaultWorker returns the worker configuration used for keys that neither
// the file nor the environment sets.
func DefaultWorker() *WorkerConfig {
	return &WorkerConfig{
		Common: defaultCommon(":9090"),
		Worker: WorkerSettings{
			Concurrency:          10,
			Queues:               map[string]int{"default": 1},
			ShutdownTimeout:      30 * time.Second,
			ContentionBackoffMin: backoff.Requeue.Min,
			ContentionBackoffMax: backoff.Requeue.Max,
		},
		Demo: DemoSettings{Store: DemoRedis},
	}
}

// DefaultScheduler returns the scheduler configuration used for keys that
// neither the file nor the environment sets. It has no schedules.
func DefaultScheduler() *SchedulerConfig {
	return &SchedulerConfig{
		Common: defaultCommon(":9091"),
		Scheduler: SchedulerSettings{
			MaxClockSkew:  DefaultMaxClockSkew,
			TickLockTTL:   5 * time.Second,
			TaskRetention: DefaultTaskRetention,
			MaxCatchUp:    100,
		},
	}
}

func defaultCommon(httpAddr string) Common {
	return Common{
		Redis: RedisConfig{
			Mode:         RedisSingle,
			DialTimeout:  5 * time.Second,
			ReadTimeout:  3 * time.Second,
			WriteTimeout: 3 * time.Second,
		},
		HTTP: HTTPConfig{Addr: httpAddr},
		Log:  LogConfig{Format: "json", Level: "info"},
		Lock: LockConfig{
			Backend:             BackendRedis,
			Prefix:              "lockstep:",
			TTL:                 lock.DefaultTTL,
			WaitReplicasTimeout: 100 * time.Millisecond,
			FenceTTL:            lock.DefaultFenceTTL,
		},
	}
}

// setDefaults fills a schedule before its YAML is decoded into it, so that
// an explicit zero in the file (max_retry: 0) is kept.
func (s *Schedule) setDefaults() {
	*s = Schedule{Timezone: "UTC", Queue: "default", MaxRetry: 5, CatchUp: CatchUpSkip, Overlap: OverlapAllow}
}
