package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrors pins the exact message of each problem. FILE stands for the
// config file and DIR for the directory holding it.
func TestErrors(t *testing.T) {
	t.Parallel()
	const ok = "redis:\n  addr: 127.0.0.1:6379\n"
	tests := []struct {
		name      string
		scheduler bool
		yaml      string
		env       map[string]string
		want      string // lines joined with \n
	}{
		// Decoding.
		{name: "unknown field with line", yaml: ok + "worker:\n  concurency: 5\n",
			want: `FILE: line 4: unknown field "concurency" in worker`},
		{name: "unknown top-level field", yaml: ok + "redis_addr: x\n",
			want: `FILE: line 3: unknown field "redis_addr"`},
		{name: "scheduler key in worker", yaml: ok + "schedules: []\n",
			want: `FILE: line 3: unknown field "schedules"`},
		{name: "duplicate field", yaml: ok + "  addr: 127.0.0.2:6379\n",
			want: `FILE: line 3: duplicate field "addr" in redis`},
		{name: "bad duration", yaml: ok + "  dial_timeout: 5 sec\n",
			want: `FILE: line 3: redis.dial_timeout: invalid duration "5 sec"`},
		{name: "duration without unit", yaml: ok + "lock:\n  ttl: 30\n",
			want: `FILE: line 4: lock.ttl: invalid duration "30"`},
		{name: "bad integer", yaml: ok + "worker:\n  concurrency: ten\n",
			want: `FILE: line 4: worker.concurrency: invalid integer "ten"`},
		{name: "bad boolean", yaml: ok + "worker:\n  demo: yes please\n",
			want: `FILE: line 4: worker.demo: invalid boolean "yes please" (want true or false)`},
		{name: "scalar for section", yaml: "redis: localhost:6379\n",
			want: `FILE: line 1: redis: expected a mapping, got "localhost:6379"`},
		{name: "list for scalar", yaml: "redis:\n  addr: [a, b]\n",
			want: `FILE: line 2: redis.addr: expected a single value, got a list`},
		{name: "list for map", yaml: ok + "worker:\n  queues: [default]\n",
			want: `FILE: line 4: worker.queues: expected a mapping, got a list`},
		{name: "top level not a mapping", yaml: "- redis\n",
			want: `FILE: line 1: expected a mapping, got a list`},
		// yaml.v3 counts the lines of some syntax errors from 0; we pass them on as they are.
		{name: "invalid yaml", yaml: ok + "worker: {concurrency: 1\n",
			want: `FILE: line 2: invalid YAML: did not find expected ',' or '}'`},
		{name: "two documents", yaml: ok + "---\nredis: {}\n",
			want: `FILE: line 3: only one YAML document is allowed`},
		{name: "decode errors skip validation", yaml: "worker:\n  concurrency: 0\n  typo: 1\n",
			want: `FILE: line 3: unknown field "typo" in worker`},

		// Redis.
		{name: "missing addr", yaml: "log:\n  level: info\n",
			want: `FILE: redis.addr: required`},
		{name: "missing addr in section", yaml: "\nredis:\n  db: 1\n",
			want: `FILE: line 2: redis.addr: required`},
		{name: "empty file", yaml: "",
			want: `FILE: redis.addr: required`},
		{name: "addr without port", yaml: "redis:\n  addr: localhost\n",
			want: `FILE: line 2: redis.addr: invalid address "localhost": missing port in address`},
		{name: "addr bad port", yaml: "redis:\n  addr: localhost:redis\n",
			want: `FILE: line 2: redis.addr: invalid address "localhost:redis": invalid port "redis"`},
		{name: "negative db and timeout", yaml: ok + "  db: -1\n  read_timeout: -1s\n",
			want: "FILE: line 3: redis.db: must be at least 0, got -1\nFILE: line 4: redis.read_timeout: must be at least 0s, got -1s"},
		{name: "password and password_file", yaml: ok + "  password: x\n  password_file: /run/secrets/redis\n",
			want: `FILE: line 4: redis.password_file: cannot be set together with redis.password`},
		{name: "password_file missing", yaml: ok + "  password_file: DIR/nope\n",
			want: `FILE: line 3: redis.password_file: cannot read "DIR/nope": no such file or directory`},
		{name: "password_file empty", yaml: ok + "  password_file: DIR/empty\n",
			want: `FILE: line 3: redis.password_file: file "DIR/empty" is empty`},
		{name: "tls cert without key", yaml: ok + "  tls:\n    enabled: true\n    cert_file: c.pem\n",
			want: `FILE: line 3: redis.tls.key_file: required when redis.tls.cert_file is set`},
		{name: "tls key without cert", yaml: ok + "  tls:\n    enabled: true\n    key_file: k.pem\n",
			want: `FILE: line 3: redis.tls.cert_file: required when redis.tls.key_file is set`},
		{name: "tls files while disabled", yaml: ok + "  tls:\n    ca_file: ca.pem\n",
			want: `FILE: line 4: redis.tls.ca_file: is set but redis.tls.enabled is false`},
		{name: "tls ca not pem", yaml: ok + "  tls:\n    enabled: true\n    ca_file: DIR/empty\n",
			want: `FILE: line 5: redis.tls.ca_file: no PEM certificate in "DIR/empty"`},
		{name: "tls ca missing", yaml: ok + "  tls:\n    enabled: true\n    ca_file: DIR/nope\n",
			want: `FILE: line 5: redis.tls.ca_file: cannot read "DIR/nope": no such file or directory`},
		{name: "tls bad key pair", yaml: ok + "  tls:\n    enabled: true\n    cert_file: DIR/empty\n    key_file: DIR/empty\n",
			want: `FILE: line 5: redis.tls.cert_file: cannot load key pair "DIR/empty", "DIR/empty": tls: failed to find any PEM data in certificate input`},

		// HTTP, log, lock.
		{name: "http addr", yaml: ok + "http:\n  addr: 9090\n",
			want: `FILE: line 4: http.addr: invalid address "9090": missing port in address`},
		{name: "log format and level", yaml: ok + "log:\n  format: xml\n  level: verbose\n",
			want: "FILE: line 4: log.format: must be json or text, got \"xml\"\nFILE: line 5: log.level: must be debug, info, warn or error, got \"verbose\""},
		{name: "lock prefix with brace", yaml: ok + "lock:\n  prefix: \"a{b}:\"\n",
			want: `FILE: line 4: lock.prefix: must not contain '{' or '}', which delimit the Redis Cluster hash tag, got "a{b}:"`},
		{name: "lock ttl zero", yaml: ok + "lock:\n  ttl: 0s\n",
			want: `FILE: line 4: lock.ttl: must be greater than 0, got 0s`},
		{name: "renew not below ttl", yaml: ok + "lock:\n  ttl: 10s\n  renew_interval: 10s\n",
			want: `FILE: line 5: lock.renew_interval: must be less than lock.ttl (10s), got 10s`},
		{name: "fence ttl below the clock bound", yaml: ok + "lock:\n  fence_ttl: 1s\n",
			want: `FILE: line 4: lock.fence_ttl: must be at least 2s (the default max_clock_skew, how far Redis servers' clocks may differ), got 1s`},
		{name: "drift eats the lease", yaml: ok + "lock:\n  ttl: 30s\n  drift_margin: 20s\n",
			want: `FILE: line 5: lock.drift_margin: must be less than lock.ttl minus the renew interval (20s), got 20s`},
		{name: "wait replicas without timeout", yaml: ok + "lock:\n  wait_replicas: 1\n  wait_replicas_timeout: 0s\n",
			want: `FILE: line 5: lock.wait_replicas_timeout: must be greater than 0 when lock.wait_replicas is set, got 0s`},

		// Redis modes and lock backends.
		{name: "bad redis mode", yaml: ok + "  mode: replicated\n",
			want: `FILE: line 3: redis.mode: must be single, sentinel or cluster, got "replicated"`},
		{name: "sentinel without master_name", yaml: "redis:\n  mode: sentinel\n  addrs: [s1:26379, s2:26379]\n",
			want: `FILE: line 1: redis.master_name: required with redis.mode sentinel: the name the sentinels monitor the master by`},
		{name: "sentinel with addr", yaml: "redis:\n  mode: sentinel\n  addr: m:6379\n  master_name: mymaster\n",
			want: "FILE: line 3: redis.addr: is not used with redis.mode sentinel: list the sentinels in redis.addrs\n" +
				"FILE: line 1: redis.addrs: required with redis.mode sentinel: list the sentinels as host:port"},
		{name: "cluster with db", yaml: "redis:\n  mode: cluster\n  addrs: [c1:7000]\n  db: 2\n",
			want: `FILE: line 4: redis.db: must be 0 with redis.mode cluster (Redis Cluster has only database 0), got 2`},
		{name: "cluster bad seed", yaml: "redis:\n  mode: cluster\n  addrs: [c1:7000, c2]\n",
			want: `FILE: line 3: redis.addrs[1]: invalid address "c2": missing port in address`},
		{name: "cluster with master_name", yaml: "redis:\n  mode: cluster\n  addrs: [c1:7000]\n  master_name: m\n",
			want: `FILE: line 4: redis.master_name: is only used with redis.mode sentinel (redis.mode is "cluster")`},
		{name: "single with addrs", yaml: ok + "  addrs: [a:1]\n",
			want: `FILE: line 3: redis.addrs: is only used with redis.mode sentinel or cluster; set redis.addr for a single server`},
		{name: "single with sentinel password", yaml: ok + "  sentinel_password: x\n",
			want: `FILE: line 3: redis.sentinel_password: is only used with redis.mode sentinel (redis.mode is "single")`},
		{name: "bad lock backend", yaml: ok + "lock:\n  backend: zookeeper\n",
			want: `FILE: line 4: lock.backend: must be redis, redlock or etcd, got "zookeeper"`},
		{name: "etcd without endpoints", yaml: ok + "lock:\n  backend: etcd\n",
			want: `FILE: line 3: lock.etcd.endpoints: required with lock.backend etcd: list the etcd members as host:port or http(s)://host:port`},
		{name: "etcd bad, duplicate and https-without-tls endpoints", yaml: ok + "lock:\n  backend: etcd\n  etcd:\n    endpoints:\n      - e1:2379\n      - e2\n      - http://e1:2379\n      - https://e3:2379\n      - grpc://e4:1\n",
			want: "FILE: line 8: lock.etcd.endpoints[1]: invalid endpoint \"e2\": missing port in address\n" +
				"FILE: line 9: lock.etcd.endpoints[2]: duplicate endpoint \"http://e1:2379\", also lock.etcd.endpoints[0]\n" +
				"FILE: line 10: lock.etcd.endpoints[3]: endpoint \"https://e3:2379\" is https but lock.etcd.tls.enabled is false\n" +
				"FILE: line 11: lock.etcd.endpoints[4]: invalid endpoint \"grpc://e4:1\": scheme \"grpc\" is not http or https"},
		{name: "etcd with redlock and redis options", yaml: ok + "lock:\n  backend: etcd\n  etcd: {endpoints: [e1:2379]}\n  nodes: [n1:1, n2:1, n3:1]\n  wait_replicas: 1\n",
			want: "FILE: line 6: lock.nodes: is only used with lock.backend redlock (lock.backend is \"etcd\"); list etcd members in lock.etcd.endpoints\n" +
				"FILE: line 7: lock.wait_replicas: is not supported with lock.backend etcd, which commits every lock through its raft quorum, got 1"},
		{name: "etcd password without username, tls file without tls", yaml: ok + "lock:\n  backend: etcd\n  etcd:\n    endpoints: [e1:2379]\n    password: pw\n    tls:\n      ca_file: /x.pem\n    dial_timeout: -1s\n",
			want: "FILE: line 10: lock.etcd.dial_timeout: must be at least 0s, got -1s\n" +
				"FILE: line 5: lock.etcd.username: required when lock.etcd.password or password_file is set\n" +
				"FILE: line 9: lock.etcd.tls.ca_file: is set but lock.etcd.tls.enabled is false"},
		{name: "etcd ttl below the bound of the election timeout", yaml: ok + "lock:\n  backend: etcd\n  ttl: 2s\n  etcd: {endpoints: [e1:2379]}\n",
			want: "FILE: line 5: lock.ttl: must be at least 3s with lock.backend etcd: the renew interval (ttl/3) + 2 × lock.etcd.election_timeout (1s), " +
				"the longest a replaced etcd leader may still revoke leases; got 2s"},
		{name: "etcd ttl below the bound, renew interval and election timeout set", yaml: ok + "lock:\n  backend: etcd\n  ttl: 2s\n  renew_interval: 1s\n  etcd: {endpoints: [e1:2379], election_timeout: 600ms}\n",
			want: "FILE: line 5: lock.ttl: must be at least 2.2s with lock.backend etcd: the renew interval (1s) + 2 × lock.etcd.election_timeout (600ms), " +
				"the longest a replaced etcd leader may still revoke leases; got 2s"},
		{name: "etcd section without etcd backend", yaml: ok + "lock:\n  etcd:\n    endpoints: [e1:2379]\n",
			want: `FILE: line 4: lock.etcd: is only used with lock.backend etcd (lock.backend is "redis")`},
		{name: "env etcd endpoints", yaml: ok, env: map[string]string{"LOCKSTEP_LOCK_BACKEND": "etcd", "LOCKSTEP_LOCK_ETCD_ENDPOINTS": "e1:2379,e2"},
			want: `env LOCKSTEP_LOCK_ETCD_ENDPOINTS: lock.etcd.endpoints[1]: invalid endpoint "e2": missing port in address`},
		{name: "redlock without nodes", yaml: ok + "lock:\n  backend: redlock\n",
			want: `FILE: line 3: lock.nodes: required with lock.backend redlock: list an odd number of independent Redis masters (3 or more, usually 5)`},
		{name: "redlock with even nodes", yaml: ok + "lock:\n  backend: redlock\n  nodes: [n1:6379, n2:6379, n3:6379, n4:6379]\n",
			want: `FILE: line 5: lock.nodes: must list an odd number of nodes, 3 or more (usually 5), got 4`},
		{name: "redlock with one node", yaml: ok + "lock:\n  backend: redlock\n  nodes: [n1:6379]\n",
			want: `FILE: line 5: lock.nodes: must list an odd number of nodes, 3 or more (usually 5), got 1`},
		{name: "redlock duplicate and bad nodes", yaml: ok + "lock:\n  backend: redlock\n  nodes:\n    - n1:1\n    - n2\n    - n1:1\n",
			want: "FILE: line 7: lock.nodes[1]: invalid address \"n2\": missing port in address\n" +
				"FILE: line 8: lock.nodes[2]: duplicate node \"n1:1\", also lock.nodes[0]"},
		{name: "redlock with wait_replicas", yaml: ok + "lock:\n  backend: redlock\n  nodes: [n1:1, n2:1, n3:1]\n  wait_replicas: 1\n",
			want: `FILE: line 6: lock.wait_replicas: is not supported with lock.backend redlock, whose nodes are independent masters, got 1`},
		{name: "redlock node timeout above ttl", yaml: ok + "lock:\n  backend: redlock\n  nodes: [n1:1, n2:1, n3:1]\n  ttl: 1s\n  node_timeout: 2s\n",
			want: `FILE: line 7: lock.node_timeout: must be less than lock.ttl (1s), got 2s`},
		{name: "nodes without redlock", yaml: ok + "lock:\n  nodes: [n1:1, n2:1, n3:1]\n",
			want: `FILE: line 4: lock.nodes: is only used with lock.backend redlock (lock.backend is "redis")`},
		{name: "wait_replicas with cluster", yaml: "redis:\n  mode: cluster\n  addrs: [c1:7000]\nlock:\n  wait_replicas: 1\n",
			want: `FILE: line 5: lock.wait_replicas: is not supported with redis.mode cluster, got 1`},
		{name: "env redlock even nodes", yaml: ok, env: map[string]string{"LOCKSTEP_LOCK_BACKEND": "redlock", "LOCKSTEP_LOCK_NODES": "a:1, b:1"},
			want: `env LOCKSTEP_LOCK_NODES: must list an odd number of nodes, 3 or more (usually 5), got 2`},
		{name: "env cluster keeps file addr", yaml: ok, env: map[string]string{"LOCKSTEP_REDIS_MODE": "cluster", "LOCKSTEP_REDIS_ADDRS": "c1:7000,c2:7000"},
			want: `FILE: line 2: redis.addr: is not used with redis.mode cluster: list the cluster's seed nodes in redis.addrs`},

		// Worker.
		{name: "concurrency zero", yaml: ok + "worker:\n  concurrency: 0\n",
			want: `FILE: line 4: worker.concurrency: must be greater than 0, got 0`},
		{name: "queue priority", yaml: ok + "worker:\n  queues:\n    critical: 0\n    default: -1\n",
			want: "FILE: line 5: worker.queues.critical: priority must be greater than 0, got 0\nFILE: line 6: worker.queues.default: priority must be greater than 0, got -1"},
		{name: "no queues", yaml: ok + "worker:\n  queues: {}\n",
			want: `FILE: line 4: worker.queues: at least one queue is required`},
		{name: "duplicate queue", yaml: ok + "worker:\n  queues: {a: 1, a: 2}\n",
			want: `FILE: line 4: worker.queues: duplicate key "a"`},
		{name: "backoff max below min", yaml: ok + "worker:\n  contention_backoff_min: 1s\n  contention_backoff_max: 10ms\n",
			want: `FILE: line 5: worker.contention_backoff_max: must be at least worker.contention_backoff_min (1s), got 10ms`},
		{name: "negative poll interval", yaml: ok + "worker:\n  poll_interval: -1s\n",
			want: `FILE: line 4: worker.poll_interval: must be at least 0s, got -1s`},

		// Demo.
		{name: "unknown demo store", yaml: ok + "demo:\n  store: mysql\n",
			want: `FILE: line 4: demo.store: must be redis or postgres, got "mysql"`},
		{name: "postgres store without dsn", yaml: ok + "demo:\n  store: postgres\n",
			want: `FILE: line 3: demo.postgres_dsn: required with demo.store postgres`},
		{name: "env unknown demo store", yaml: ok, env: map[string]string{"LOCKSTEP_DEMO_STORE": "Postgres"},
			want: `env LOCKSTEP_DEMO_STORE: must be redis or postgres, got "Postgres"`},
		{name: "dsn with the redis store", yaml: ok, env: map[string]string{"LOCKSTEP_DEMO_POSTGRES_DSN": "postgres://u:pw@db/demo"},
			want: `env LOCKSTEP_DEMO_POSTGRES_DSN: is allowed only with demo.store: postgres`},

		// Environment.
		{name: "env bad integer", yaml: ok, env: map[string]string{"LOCKSTEP_WORKER_CONCURRENCY": "ten"},
			want: `env LOCKSTEP_WORKER_CONCURRENCY: invalid integer "ten"`},
		{name: "env bad duration", yaml: ok, env: map[string]string{"LOCKSTEP_REDIS_DIAL_TIMEOUT": "5 sec"},
			want: `env LOCKSTEP_REDIS_DIAL_TIMEOUT: invalid duration "5 sec"`},
		{name: "env value fails validation", yaml: ok, env: map[string]string{"LOCKSTEP_WORKER_CONCURRENCY": "0"},
			want: `env LOCKSTEP_WORKER_CONCURRENCY: must be greater than 0, got 0`},
		{name: "env fence ttl below the clock bound", yaml: ok, env: map[string]string{"LOCKSTEP_LOCK_FENCE_TTL": "500ms"},
			want: `env LOCKSTEP_LOCK_FENCE_TTL: must be at least 2s (the default max_clock_skew, how far Redis servers' clocks may differ), got 500ms`},
		{name: "env empty addr", yaml: ok, env: map[string]string{"LOCKSTEP_REDIS_ADDR": ""},
			want: `env LOCKSTEP_REDIS_ADDR: required`},
		{name: "env queue entry", yaml: ok, env: map[string]string{"LOCKSTEP_WORKER_QUEUES": "critical"},
			want: `env LOCKSTEP_WORKER_QUEUES: invalid entry "critical" (want name=value)`},
		{name: "env queue priority", yaml: ok, env: map[string]string{"LOCKSTEP_WORKER_QUEUES": "critical=x"},
			want: `env LOCKSTEP_WORKER_QUEUES: worker.queues.critical: invalid integer "x"`},
		{name: "env queue priority zero", yaml: ok, env: map[string]string{"LOCKSTEP_WORKER_QUEUES": "a=1,critical=0"},
			want: `env LOCKSTEP_WORKER_QUEUES: worker.queues.critical: priority must be greater than 0, got 0`},
		{name: "env and file errors", yaml: ok + "worker:\n  demo: maybe\n", env: map[string]string{"LOCKSTEP_LOCK_TTL": "forever"},
			want: "FILE: line 4: worker.demo: invalid boolean \"maybe\" (want true or false)\nenv LOCKSTEP_LOCK_TTL: invalid duration \"forever\""},

		// Scheduler.
		{name: "scheduler settings", scheduler: true, yaml: ok + "scheduler:\n  tick_lock_ttl: 0s\n  max_catch_up: 0\n",
			want: "FILE: line 4: scheduler.tick_lock_ttl: must be greater than 0, got 0s\nFILE: line 5: scheduler.max_catch_up: must be greater than 0, got 0"},
		{name: "bad timezone", scheduler: true, yaml: ok + "schedules:\n  - name: settle-orders\n    cron: '* * * * * *'\n    task: t\n    timezone: Mars/Base\n",
			want: `FILE: line 7: schedules[0] (settle-orders).timezone: unknown time zone "Mars/Base"`},
		{name: "local timezone", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, timezone: Local}\n",
			want: `FILE: line 4: schedules[0] (a).timezone: "Local" is not allowed; name a zone such as UTC`},
		{name: "duplicate schedule names", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t}\n  - {name: b, cron: x, task: t}\n  - {name: a, cron: y, task: t}\n",
			want: `FILE: line 6: schedules[2] (a).name: duplicate name "a", first used by schedules[0]`},
		{name: "schedule name with colon", scheduler: true, yaml: ok + "schedules:\n  - {name: 'a:b', cron: x, task: t}\n",
			want: `FILE: line 4: schedules[0] (a:b).name: invalid name "a:b" (use letters, digits, '_', '.' and '-')`},
		{name: "schedule required fields", scheduler: true, yaml: ok + "schedules:\n  - queue: ''\n",
			want: "FILE: line 4: schedules[0].name: required\nFILE: line 4: schedules[0].cron: required\nFILE: line 4: schedules[0].task: required\nFILE: line 4: schedules[0].queue: required"},
		{name: "payload list", scheduler: true, yaml: ok + "schedules:\n  - name: a\n    cron: x\n    task: t\n    payload: [1, 2]\n",
			want: `FILE: line 7: schedules[0] (a).payload: must be a mapping (JSON object), got a list`},
		{name: "payload string", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, payload: '{\"order_id\": 1}'}\n",
			want: `FILE: line 4: schedules[0] (a).payload: must be a mapping (JSON object), got "{\"order_id\": 1}"`},
		{name: "payload not json", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, payload: {x: .inf}}\n",
			want: `FILE: line 4: schedules[0] (a).payload: cannot convert to JSON: json: unsupported value: +Inf`},
		{name: "bad catch_up", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, catch_up: sometimes}\n",
			want: `FILE: line 4: schedules[0] (a).catch_up: must be skip, once or all, got "sometimes"`},
		{name: "bad overlap", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, overlap: queue}\n",
			want: `FILE: line 4: schedules[0] (a).overlap: must be allow, skip, buffer_one or cancel_previous, got "queue"`},
		{name: "negative retry and timeout", scheduler: true, yaml: ok + "schedules:\n  - {name: a, cron: x, task: t, max_retry: -1, timeout: -1s, max_catch_up: -1}\n",
			want: "FILE: line 4: schedules[0] (a).max_retry: must be at least 0, got -1\nFILE: line 4: schedules[0] (a).timeout: must be at least 0s, got -1s\nFILE: line 4: schedules[0] (a).max_catch_up: must be at least 0, got -1"},
		{name: "unknown schedule field", scheduler: true, yaml: ok + "schedules:\n  - name: a\n    cronn: x\n",
			want: `FILE: line 5: unknown field "cronn" in schedules[0] (a)`},
		{name: "schedules not a list", scheduler: true, yaml: ok + "schedules:\n  name: a\n",
			want: `FILE: line 4: schedules: expected a list, got a mapping`},
		{name: "env schedules", scheduler: true, yaml: ok, env: map[string]string{"LOCKSTEP_SCHEDULES": `[{"name": "x", "cron": "c", "task": "t", "timezone": "Mars/Base"}]`},
			want: `env LOCKSTEP_SCHEDULES: line 1: schedules[0] (x).timezone: unknown time zone "Mars/Base"`},
		{name: "env schedules syntax", scheduler: true, yaml: ok, env: map[string]string{"LOCKSTEP_SCHEDULES": `[{"name": "x"`},
			want: `env LOCKSTEP_SCHEDULES: line 1: invalid YAML: did not find expected ',' or '}'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(file, []byte(strings.ReplaceAll(tt.yaml, "DIR", dir)), 0o600); err != nil {
				t.Fatal(err)
			}
			var err error
			if tt.scheduler {
				_, err = LoadScheduler(file, envMap(tt.env))
			} else {
				_, err = LoadWorker(file, envMap(tt.env))
			}
			want := strings.NewReplacer("FILE", file, "DIR", dir).Replace(tt.want)
			if err == nil {
				t.Fatalf("no error, want\n%s", want)
			}
			if err.Error() != want {
				t.Errorf("got\n%s\nwant\n%s", err, want)
			}
			if _, ok := errors.AsType[*Error](err); !ok {
				t.Errorf("%T is not an *Error", err)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  Error
		want string
	}{
		{Error{File: "w.yaml", Line: 3, Field: "redis.addr", Msg: "required"}, "w.yaml: line 3: redis.addr: required"},
		{Error{Field: "redis.addr", Msg: "required"}, "redis.addr: required"},
		{Error{Env: "LOCKSTEP_REDIS_ADDR", Field: "redis.addr", Msg: "required"}, "env LOCKSTEP_REDIS_ADDR: required"},
		{Error{Env: "LOCKSTEP_SCHEDULES", Line: 2, Field: "schedules[0].task", Msg: "required"}, "env LOCKSTEP_SCHEDULES: line 2: schedules[0].task: required"},
		{Error{File: "w.yaml", Msg: "cannot read", Err: errors.New("a\nb")}, "w.yaml: cannot read: a b"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

// A run-time schedule is held to a file entry's rules, with the same
// messages, located at "schedule (NAME)".
func TestCheckSchedule(t *testing.T) {
	t.Parallel()
	ok := NewSchedule()
	ok.Name, ok.Cron, ok.Task = "acme", "@hourly", "t"
	if err := CheckSchedule(&ok); err != nil {
		t.Fatalf("valid: %v", err)
	}
	if ok.Timezone != "UTC" || ok.Queue != "default" || ok.MaxRetry != 5 || ok.CatchUp != CatchUpSkip || ok.MaxCatchUp != 0 {
		t.Errorf("defaults: %+v", ok)
	}
	for _, tc := range []struct {
		edit func(*Schedule)
		want string
	}{
		{func(s *Schedule) { s.Name = "a:b" }, `schedule (a:b).name: invalid name "a:b" (use letters, digits, '_', '.' and '-')`},
		{func(s *Schedule) { s.Name = "" }, `schedule.name: required`},
		{func(s *Schedule) { s.Task = "" }, `schedule (acme).task: required`},
		{func(s *Schedule) { s.Timezone = "Local" }, `schedule (acme).timezone: "Local" is not allowed; name a zone such as UTC`},
		{func(s *Schedule) { s.Timezone = "Mars/Base" }, `schedule (acme).timezone: unknown time zone "Mars/Base"`},
		{func(s *Schedule) { s.Payload = json.RawMessage(`[1, 2]`) }, `schedule (acme).payload: must be a mapping (JSON object), got a list`},
		{func(s *Schedule) { s.Payload = json.RawMessage(`{x`) }, `schedule (acme).payload: must be a mapping (JSON object), got invalid JSON`},
		{func(s *Schedule) { s.CatchUp = "sometimes" }, `schedule (acme).catch_up: must be skip, once or all, got "sometimes"`},
		{func(s *Schedule) { s.Overlap = "Skip" }, `schedule (acme).overlap: must be allow, skip, buffer_one or cancel_previous, got "Skip"`},
		{func(s *Schedule) { s.MaxRetry = -1 }, `schedule (acme).max_retry: must be at least 0, got -1`},
	} {
		s := ok
		tc.edit(&s)
		err := CheckSchedule(&s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSchedule = %v, want %q", err, tc.want)
		}
	}
}
