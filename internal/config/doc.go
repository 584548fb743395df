// Package config loads the YAML configuration of the worker and scheduler
// binaries and lets LOCKSTEP_* environment variables override it.
//
// # Order
//
// A value comes from, in rising precedence: the defaults (DefaultWorker,
// DefaultScheduler), the YAML file, the environment. Validation runs last, on
// the merged result, and completes it: redis.password_file is read into
// redis.password (lock.etcd.password_file into lock.etcd.password), and each schedule gets its time zone and catch-up cap.
//
// # Environment
//
// Every field can be set by a variable named LOCKSTEP_ followed by its YAML
// path, upper-cased, with dots as underscores: redis.addr is
// LOCKSTEP_REDIS_ADDR, redis.tls.ca_file is LOCKSTEP_REDIS_TLS_CA_FILE. A set
// variable wins even when empty. Scalars take the same text as YAML
// (durations like "5s"). Maps take "name=value" pairs separated by commas
// (LOCKSTEP_WORKER_QUEUES="critical=6,default=3") or a YAML/JSON mapping.
// Lists take a YAML or JSON document that replaces the whole list
// (LOCKSTEP_SCHEDULES='[{"name":"a","cron":"* * * * *","task":"t"}]'); lists
// of strings also take values separated by commas
// (LOCKSTEP_LOCK_NODES="r1:6379,r2:6379,r3:6379").
//
// # Deployments
//
// redis.mode says what the redis section reaches: single (redis.addr), a
// Sentinel-managed master (redis.addrs lists the sentinels, redis.master_name
// names the master) or a Cluster (redis.addrs lists seed nodes; db 0 only).
// UniversalOptions gives the matching go-redis client kind; asynq runs on
// that client (asynq.NewClientFromRedisClient and friends).
// lock.backend says where locks live: redis (the redis section's deployment),
// redlock (a quorum of lock.nodes, an odd number of independent masters
// reached with the redis section's credentials, TLS and timeouts) or etcd (the
// cluster of lock.etcd.endpoints, with its own credentials and TLS; the keys
// of lock.etcd are refused with any other backend). Common.NewLocker builds
// the Locker for each, for both binaries.
//
// # Guarantees
//
//   - Strict: an unknown or repeated key, or a value of the wrong shape, is
//     an error, not ignored. A null value keeps the default.
//   - Every error is an *Error, or several joined with errors.Join, and each
//     names in one line where the value came from (file and line, or env
//     variable), the field and the offending value:
//     configs/worker.yaml: line 9: redis.dial_timeout: invalid duration "5 sec".
//     The first line is always a real problem; validation is skipped when
//     decoding failed, so it adds no follow-on noise. Lines of YAML syntax
//     errors are the parser's, which for some errors counts from 0.
//   - Secrets stay secret: the password and password file contents never
//     appear in errors, and Secret and RedisConfig redact themselves in fmt,
//     slog, JSON and YAML output.
//   - Schedule time zones are checked against the zone database embedded in
//     the binary (time/tzdata), so they do not depend on the host.
//
// It does not check cron expressions (the scheduler package does), whether a
// schedule's queue is served by some worker, or that Redis is reachable; and it
// does not reload: configuration is read once at start.
package config
