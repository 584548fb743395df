package config

import (
	"encoding/json"
	"errors"
	"io/fs"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

const minimal = "redis:\n  addr: 127.0.0.1:6379\n"

func TestLoadWorkerDefaults(t *testing.T) {
	t.Parallel()
	got := loadWorker(t, minimal)
	want := DefaultWorker()
	want.Redis.Addr = "127.0.0.1:6379"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if want.HTTP.Addr != ":9090" || want.Lock.Prefix != "lockstep:" || want.Worker.Concurrency != 10 ||
		want.Redis.DialTimeout != 5*time.Second || want.Lock.WaitReplicasTimeout != 100*time.Millisecond {
		t.Errorf("defaults changed: %+v", want)
	}
}

func TestLoadSchedulerDefaults(t *testing.T) {
	t.Parallel()
	got := mustLoad(t, LoadScheduler, writeFile(t, "s.yaml", minimal), nil)
	want := DefaultScheduler()
	want.Redis.Addr = "127.0.0.1:6379"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if got.HTTP.Addr != ":9091" || got.Scheduler.MaxCatchUp != 100 || got.Scheduler.TaskRetention != 24*time.Hour {
		t.Errorf("defaults changed: %+v", got)
	}
}

func TestLoadWorkerFileValues(t *testing.T) {
	t.Parallel()
	got := mustLoad(t, LoadWorker, "testdata/worker.yaml", nil)
	want := &WorkerConfig{
		Common: Common{
			Redis: RedisConfig{
				Mode: RedisSingle, Addr: "redis.internal:6380", DB: 3, Username: "app",
				DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 4 * time.Second, PoolSize: 20,
			},
			HTTP: HTTPConfig{Addr: "127.0.0.1:8080"},
			Log:  LogConfig{Format: "text", Level: "debug"},
			Lock: LockConfig{
				Backend: BackendRedis, Prefix: "app:", TTL: time.Minute, RenewInterval: 15 * time.Second, DriftMargin: 2 * time.Second,
				WaitReplicas: 1, WaitReplicasTimeout: 250 * time.Millisecond, FenceTTL: 10 * time.Second,
			},
		},
		Worker: WorkerSettings{
			Concurrency: 4, Queues: map[string]int{"critical": 6, "default": 3}, StrictPriority: true,
			ShutdownTimeout: 90 * time.Second, ContentionBackoffMin: 50 * time.Millisecond, ContentionBackoffMax: 2 * time.Second,
		},
		Demo: DemoSettings{Store: DemoPostgres, PostgresDSN: "postgres://demo@db.internal/demo"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestExampleConfigsLoad(t *testing.T) {
	t.Parallel()
	// The worker example shows the defaults: a copy of it serves no demo.
	w := mustLoad(t, LoadWorker, "../../configs/worker.yaml", nil)
	def := mustLoad(t, LoadWorker, "", envMap(map[string]string{"LOCKSTEP_REDIS_ADDR": w.Redis.Addr}))
	if got, want := asYAML(t, w), asYAML(t, def); w.Redis.Addr != "127.0.0.1:6379" || w.Worker.Demo || got != want {
		t.Errorf("worker example\n%s\nwant the defaults\n%s", got, want)
	}
	s := mustLoad(t, LoadScheduler, "../../configs/scheduler.yaml", nil)
	if len(s.Schedules) == 0 || s.Schedules[0].Task != "demo:order.pay" {
		t.Fatalf("scheduler: %+v", s)
	}
	// The scheduler example's settings are the defaults too; its schedules
	// are examples (there are none by default).
	sd := mustLoad(t, LoadScheduler, "", envMap(map[string]string{"LOCKSTEP_REDIS_ADDR": s.Redis.Addr}))
	settings := *s
	settings.Schedules = nil
	if got, want := asYAML(t, &settings), asYAML(t, sd); got != want {
		t.Errorf("scheduler example\n%s\nwant the defaults\n%s", got, want)
	}
	var p struct {
		OrderID string `json:"order_id"`
		WorkMS  int    `json:"work_ms"`
	}
	if err := json.Unmarshal(s.Schedules[0].Payload, &p); err != nil || p.OrderID == "" {
		t.Errorf("payload %s: %v", s.Schedules[0].Payload, err)
	}
}

func TestLoadSchedules(t *testing.T) {
	t.Parallel()
	yaml := minimal + `
scheduler:
  max_catch_up: 7
schedules:
  - name: settle-orders
    cron: "*/5 * * * * *"
    timezone: Europe/Berlin
    task: demo:order.pay
    payload: {"order_id": "42", "work_ms": 100, "tags": [a, b], "meta": {"x": null}}
    queue: critical
    max_retry: 0
    timeout: 2m
    catch_up: all
    max_catch_up: 3
    overlap: buffer_one
  - &base
    name: defaults
    cron: "@every 1m"
    task: t
  - <<: *base
    name: merged
    catch_up: once
`
	got := mustLoad(t, LoadScheduler, writeFile(t, "s.yaml", yaml), nil)
	want := []Schedule{
		{
			Name: "settle-orders", Cron: "*/5 * * * * *", Timezone: "Europe/Berlin", Task: "demo:order.pay",
			Payload: json.RawMessage(`{"meta":{"x":null},"order_id":"42","tags":["a","b"],"work_ms":100}`),
			Queue:   "critical", MaxRetry: 0, Timeout: 2 * time.Minute, CatchUp: CatchUpAll, MaxCatchUp: 3,
			Overlap: OverlapBufferOne,
		},
		{Name: "defaults", Cron: "@every 1m", Timezone: "UTC", Task: "t", Queue: "default", MaxRetry: 5, CatchUp: CatchUpSkip, MaxCatchUp: 7, Overlap: OverlapAllow},
		{Name: "merged", Cron: "@every 1m", Timezone: "UTC", Task: "t", Queue: "default", MaxRetry: 5, CatchUp: CatchUpOnce, MaxCatchUp: 7, Overlap: OverlapAllow},
	}
	if !reflect.DeepEqual(got.Schedules, want) {
		t.Errorf("got  %+v\nwant %+v", got.Schedules, want)
	}
}

func TestLoadNullKeepsDefault(t *testing.T) {
	t.Parallel()
	got := loadWorker(t, minimal+"worker:\n  concurrency:\n  queues: ~\nlog:\n")
	if got.Worker.Concurrency != 10 || !reflect.DeepEqual(got.Worker.Queues, map[string]int{"default": 1}) {
		t.Errorf("got %+v", got.Worker)
	}
}

func TestLoadPasswordFile(t *testing.T) {
	t.Parallel()
	pw := writeFile(t, "pw", "from-file\r\n")
	got := loadWorker(t, minimal+"  password_file: "+pw+"\n")
	if got.Redis.Password != "from-file" || got.Redis.PasswordFile != pw {
		t.Errorf("password not read from file: %q", string(got.Redis.Password))
	}
}

// override is one environment override and a check that it was applied.
type override struct {
	name  string
	env   map[string]string
	check func(*WorkerConfig) bool
}

// checkOverrides loads the worker config file with each override's
// environment and checks that it was applied.
func checkOverrides(t *testing.T, file string, tests []override) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, LoadWorker, file, envMap(tt.env))
			if !tt.check(c) {
				t.Errorf("override not applied: %+v", c)
			}
		})
	}
}

func TestEnvOverrides(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "w.yaml", minimal+"worker:\n  concurrency: 3\n  queues: {low: 1}\n")
	tests := []override{
		{"string", map[string]string{"LOCKSTEP_REDIS_ADDR": "10.0.0.1:7000"}, func(c *WorkerConfig) bool { return c.Redis.Addr == "10.0.0.1:7000" }},
		{"http addr", map[string]string{"LOCKSTEP_HTTP_ADDR": ":1234"}, func(c *WorkerConfig) bool { return c.HTTP.Addr == ":1234" }},
		{"int beats file", map[string]string{"LOCKSTEP_WORKER_CONCURRENCY": " 25 "}, func(c *WorkerConfig) bool { return c.Worker.Concurrency == 25 }},
		{"bool", map[string]string{"LOCKSTEP_WORKER_DEMO": "true"}, func(c *WorkerConfig) bool { return c.Worker.Demo }},
		{"demo store", map[string]string{"LOCKSTEP_DEMO_STORE": "postgres", "LOCKSTEP_DEMO_POSTGRES_DSN": "postgres://u:pw@db/demo"}, func(c *WorkerConfig) bool {
			return c.Demo.Store == DemoPostgres && c.Demo.PostgresDSN == "postgres://u:pw@db/demo"
		}},
		{"duration", map[string]string{"LOCKSTEP_WORKER_SHUTDOWN_TIMEOUT": "45s"}, func(c *WorkerConfig) bool { return c.Worker.ShutdownTimeout == 45*time.Second }},
		{"fence ttl", map[string]string{"LOCKSTEP_LOCK_FENCE_TTL": "1m"}, func(c *WorkerConfig) bool { return c.Lock.FenceTTL == time.Minute }},
		{"nested", map[string]string{"LOCKSTEP_REDIS_TLS_SERVER_NAME": "r", "LOCKSTEP_REDIS_TLS_ENABLED": "true"}, func(c *WorkerConfig) bool { return c.Redis.TLS.ServerName == "r" }},
		{"secret", map[string]string{"LOCKSTEP_REDIS_PASSWORD": "pw"}, func(c *WorkerConfig) bool { return c.Redis.Password == "pw" }},
		{"empty string wins", map[string]string{"LOCKSTEP_LOCK_PREFIX": ""}, func(c *WorkerConfig) bool { return c.Lock.Prefix == "" }},
		{"map pairs", map[string]string{"LOCKSTEP_WORKER_QUEUES": "critical=6, default=3,"}, func(c *WorkerConfig) bool {
			return reflect.DeepEqual(c.Worker.Queues, map[string]int{"critical": 6, "default": 3})
		}},
		{"map json", map[string]string{"LOCKSTEP_WORKER_QUEUES": `{"critical": 6}`}, func(c *WorkerConfig) bool {
			return reflect.DeepEqual(c.Worker.Queues, map[string]int{"critical": 6})
		}},
		{"unrelated", map[string]string{"LOCKSTEP_NOPE": "x", "REDIS_ADDR": "y"}, func(c *WorkerConfig) bool { return c.Redis.Addr == "127.0.0.1:6379" }},
	}
	checkOverrides(t, file, tests)
}

func TestEnvSchedules(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "s.yaml", minimal+"schedules:\n  - {name: from-file, cron: '* * * * * *', task: t}\n")
	for name, doc := range map[string]string{
		"json": `[{"name":"from-env","cron":"0 * * * * *","task":"t","payload":{"a":1}}]`,
		"yaml": "- name: from-env\n  cron: 0 * * * * *\n  task: t\n  payload: {a: 1}\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, LoadScheduler, file, envMap(map[string]string{"LOCKSTEP_SCHEDULES": doc}))
			if len(c.Schedules) != 1 || c.Schedules[0].Name != "from-env" || string(c.Schedules[0].Payload) != `{"a":1}` ||
				c.Schedules[0].Timezone != "UTC" || c.Schedules[0].MaxRetry != 5 {
				t.Errorf("got %+v", c.Schedules)
			}
		})
	}
}

func TestLoadWithoutFile(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, LoadWorker, "", envMap(map[string]string{"LOCKSTEP_REDIS_ADDR": "r:6379"}))
	if c.Redis.Addr != "r:6379" {
		t.Errorf("got %+v", c.Redis)
	}
	if _, err := LoadWorker("", nil); err == nil || err.Error() != "redis.addr: required" {
		t.Errorf("got %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := LoadWorker("nope/worker.yaml", nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	if err == nil || err.Error() != "nope/worker.yaml: cannot read config: no such file or directory" {
		t.Errorf("got %v", err)
	}
}

// Every scalar field must be reachable through its LOCKSTEP_* variable.
func TestEveryScalarHasEnvVar(t *testing.T) {
	t.Parallel()
	type leaf struct {
		name string
		v    reflect.Value // points into the config
		want any
	}
	for _, c := range []any{DefaultWorker(), DefaultScheduler()} {
		v := reflect.ValueOf(c).Elem()
		env := map[string]string{}
		var leaves []leaf
		var walk func(v reflect.Value, p fieldPath)
		walk = func(v reflect.Value, p fieldPath) {
			for _, f := range fields(v) {
				fp := p.field(f.name)
				name := envName(fp.key)
				switch {
				case f.v.Kind() == reflect.Struct:
					walk(f.v, fp)
				case f.v.Type() == durationType:
					env[name] = "1234ms"
					leaves = append(leaves, leaf{name, f.v, 1234 * time.Millisecond})
				case f.v.Kind() == reflect.String:
					env[name] = "env-value"
					leaves = append(leaves, leaf{name, f.v, reflect.ValueOf("env-value").Convert(f.v.Type()).Interface()})
				case f.v.Kind() == reflect.Int:
					env[name] = "1234"
					leaves = append(leaves, leaf{name, f.v, 1234})
				case f.v.Kind() == reflect.Bool:
					env[name] = strconv.FormatBool(!f.v.Bool())
					leaves = append(leaves, leaf{name, f.v, !f.v.Bool()})
				}
			}
		}
		walk(v, fieldPath{})
		if errs := applyEnv(v, fieldPath{}, envMap(env), origins{}); errs != nil {
			t.Fatal(errs)
		}
		for _, l := range leaves {
			if got := l.v.Interface(); got != l.want {
				t.Errorf("%s not applied: got %v, want %v", l.name, got, l.want)
			}
		}
		if len(leaves) < 25 {
			t.Errorf("only %d variables: %v", len(leaves), env)
		}
	}
}

// asYAML is c as YAML, so that an empty list and none compare equal.
func asYAML(t *testing.T, c any) string {
	t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The fence TTL's default is derived from the clock bound, its floor.
func TestFenceTTLDefaultIsTheClockBound(t *testing.T) {
	t.Parallel()
	if lock.DefaultFenceTTL != DefaultMaxClockSkew || DefaultWorker().Lock.FenceTTL != DefaultMaxClockSkew ||
		DefaultScheduler().Scheduler.MaxClockSkew != DefaultMaxClockSkew {
		t.Fatalf("lock.DefaultFenceTTL %v, worker lock.fence_ttl %v, scheduler max_clock_skew %v: want all %v",
			lock.DefaultFenceTTL, DefaultWorker().Lock.FenceTTL, DefaultScheduler().Scheduler.MaxClockSkew, DefaultMaxClockSkew)
	}
}

// A misspelt LOCKSTEP_ variable is refused, naming it, as an unknown YAML
// key is; a key of either binary and Lockstep's other variables are not.
func TestCheckEnvNamesUnknownVariables(t *testing.T) {
	t.Parallel()
	ok := []string{"LOCKSTEP_REDIS_ADDR=r:6379", "LOCKSTEP_WORKER_CONCURRENCY=4", "LOCKSTEP_SCHEDULER_MAX_CATCH_UP=3",
		"LOCKSTEP_LOCK_ETCD_ENDPOINTS=a,b", "LOCKSTEP_LOCAL_DURATION=30s", "PATH=/bin", "REDIS_ADDR=x"}
	if err := CheckEnv(ok); err != nil {
		t.Fatalf("CheckEnv(%v): %v", ok, err)
	}
	err := CheckEnv(append(ok, "LOCKSTEP_WORKER_CONCURENCY=4", "LOCKSTEP_REDIS_ADRR="))
	for _, name := range []string{"env LOCKSTEP_WORKER_CONCURENCY: unknown variable", "env LOCKSTEP_REDIS_ADRR: unknown variable"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("CheckEnv with misspelt variables: %v, want it to name %s", err, name)
		}
	}
}
