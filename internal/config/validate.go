package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // schedule time zones must not depend on the host's zoneinfo
)

// validator collects problems, each located where its value came from.
type validator struct {
	file    string
	origins origins
	errs    []error
}

func (v *validator) fail(p fieldPath, format string, args ...any) {
	v.add(&Error{Field: p.show, Msg: fmt.Sprintf(format, args...)}, p.key)
}

// add locates e at where key's value came from; an unset key is blamed on
// its closest set parent (a missing redis.addr on the "redis:" line), else
// on the config file.
func (v *validator) add(e *Error, key string) {
	o := origin{file: v.file}
	for k := key; k != ""; k = k[:max(strings.LastIndexAny(k, ".["), 0)] {
		if found, ok := v.origins[k]; ok {
			o = found
			break
		}
	}
	e.File, e.Env, e.Line = o.file, o.env, o.line
	v.errs = append(v.errs, e)
}

// addErr adds an *Error built outside the validator, whose Field is its key.
func (v *validator) addErr(err error) {
	if e, ok := errors.AsType[*Error](err); ok {
		v.add(e, e.Field)
		return
	}
	v.errs = append(v.errs, err)
}

func atLeast[T int | time.Duration](v *validator, p fieldPath, x, lo T) {
	if x < lo {
		v.fail(p, "must be at least %v, got %v", lo, x)
	}
}

func positive[T int | time.Duration](v *validator, p fieldPath, x T) {
	if x <= 0 {
		v.fail(p, "must be greater than 0, got %v", x)
	}
}

func oneOf[T ~string](v *validator, p fieldPath, x T, allowed ...T) {
	if slices.Contains(allowed, x) {
		return
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	v.fail(p, "must be %s or %s, got %q", strings.Join(names[:len(names)-1], ", "), names[len(names)-1], x)
}

var root fieldPath

func (c *WorkerConfig) check(v *validator) {
	c.Common.check(v)
	w, p := &c.Worker, root.field("worker")
	positive(v, p.field("concurrency"), w.Concurrency)
	if len(w.Queues) == 0 {
		v.fail(p.field("queues"), "at least one queue is required")
	}
	for _, name := range slices.Sorted(maps.Keys(w.Queues)) {
		if name == "" {
			v.fail(p.field("queues"), "queue name must not be empty")
		} else if w.Queues[name] <= 0 {
			v.fail(p.field("queues").field(name), "priority must be greater than 0, got %d", w.Queues[name])
		}
	}
	atLeast(v, p.field("shutdown_timeout"), w.ShutdownTimeout, 0)
	positive(v, p.field("contention_backoff_min"), w.ContentionBackoffMin)
	atLeast(v, p.field("poll_interval"), w.PollInterval, 0)
	if w.ContentionBackoffMax < w.ContentionBackoffMin {
		v.fail(p.field("contention_backoff_max"), "must be at least worker.contention_backoff_min (%v), got %v",
			w.ContentionBackoffMin, w.ContentionBackoffMax)
	}

	d, p := &c.Demo, root.field("demo")
	oneOf(v, p.field("store"), d.Store, DemoRedis, DemoPostgres)
	switch {
	case d.Store == DemoPostgres && d.PostgresDSN == "":
		v.fail(p.field("postgres_dsn"), "required with demo.store postgres")
	case d.Store != DemoPostgres && d.PostgresDSN != "":
		v.fail(p.field("postgres_dsn"), "is allowed only with demo.store: postgres")
	}
}

var scheduleName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

func (c *SchedulerConfig) check(v *validator) {
	c.Common.check(v)
	s, p := &c.Scheduler, root.field("scheduler")
	atLeast(v, p.field("max_clock_skew"), s.MaxClockSkew, 0)
	positive(v, p.field("tick_lock_ttl"), s.TickLockTTL)
	positive(v, p.field("task_retention"), s.TaskRetention)
	positive(v, p.field("max_catch_up"), s.MaxCatchUp)

	c.checkSchedules(v)
}

func (c *Common) check(v *validator) {
	c.checkRedis(v)

	if c.HTTP.Addr == "" {
		v.fail(root.field("http").field("addr"), "required")
	} else if err := checkHostPort(c.HTTP.Addr); err != nil {
		v.fail(root.field("http").field("addr"), "invalid address %q: %v", c.HTTP.Addr, err)
	}

	p := root.field("log")
	oneOf(v, p.field("format"), c.Log.Format, "json", "text")
	oneOf(v, p.field("level"), c.Log.Level, "debug", "info", "warn", "error")

	l, p := &c.Lock, root.field("lock")
	if strings.ContainsAny(l.Prefix, "{}") {
		v.fail(p.field("prefix"), "must not contain '{' or '}', which delimit the Redis Cluster hash tag, got %q", l.Prefix)
	}
	positive(v, p.field("ttl"), l.TTL)
	atLeast(v, p.field("renew_interval"), l.RenewInterval, 0)
	if l.TTL > 0 && l.RenewInterval >= l.TTL {
		v.fail(p.field("renew_interval"), "must be less than lock.ttl (%v), got %v", l.TTL, l.RenewInterval)
	}
	atLeast(v, p.field("drift_margin"), l.DriftMargin, 0)
	// The local deadline is last renewal + ttl - drift; it must come after the next renewal.
	if renew := cmp.Or(l.RenewInterval, l.TTL/3); l.DriftMargin > 0 && l.RenewInterval < l.TTL && l.DriftMargin >= l.TTL-renew {
		v.fail(p.field("drift_margin"), "must be less than lock.ttl minus the renew interval (%v), got %v", l.TTL-renew, l.DriftMargin)
	}
	if l.FenceTTL < DefaultMaxClockSkew {
		v.fail(p.field("fence_ttl"), "must be at least %v (the default max_clock_skew, how far Redis servers' clocks may differ), got %v",
			DefaultMaxClockSkew, l.FenceTTL)
	}
	atLeast(v, p.field("wait_replicas"), l.WaitReplicas, 0)
	if l.WaitReplicas > 0 && l.WaitReplicasTimeout <= 0 { // WAIT with timeout 0 blocks forever
		v.fail(p.field("wait_replicas_timeout"), "must be greater than 0 when lock.wait_replicas is set, got %v", l.WaitReplicasTimeout)
	}
	c.checkBackend(v)
}

// checkBackend checks lock.backend against its nodes and the Redis mode.
func (c *Common) checkBackend(v *validator) {
	l, p := &c.Lock, root.field("lock")
	oneOf(v, p.field("backend"), l.Backend, BackendRedis, BackendRedlock, BackendEtcd)
	atLeast(v, p.field("node_timeout"), l.NodeTimeout, 0)
	if l.Backend != BackendEtcd && !l.Etcd.isZero() {
		v.fail(p.field("etcd"), "is only used with lock.backend etcd (lock.backend is %q)", l.Backend)
	}
	switch l.Backend {
	case BackendEtcd:
		if len(l.Nodes) > 0 {
			v.fail(p.field("nodes"), "is only used with lock.backend redlock (lock.backend is %q); list etcd members in lock.etcd.endpoints", l.Backend)
		}
		if l.NodeTimeout != 0 {
			v.fail(p.field("node_timeout"), "is only used with lock.backend redlock (lock.backend is %q)", l.Backend)
		}
		if l.WaitReplicas > 0 {
			v.fail(p.field("wait_replicas"), "is not supported with lock.backend etcd, which commits every lock through its raft quorum, got %d", l.WaitReplicas)
		}
		c.checkEtcd(v)
	case BackendRedis:
		if len(l.Nodes) > 0 {
			v.fail(p.field("nodes"), "is only used with lock.backend redlock (lock.backend is %q)", l.Backend)
		}
		if l.NodeTimeout != 0 {
			v.fail(p.field("node_timeout"), "is only used with lock.backend redlock (lock.backend is %q)", l.Backend)
		}
		// WAIT must follow the acquire on the same connection, which a
		// Cluster client does not promise.
		if l.WaitReplicas > 0 && c.Redis.Mode == RedisCluster {
			v.fail(p.field("wait_replicas"), "is not supported with redis.mode cluster, got %d", l.WaitReplicas)
		}
	case BackendRedlock:
		switch n := len(l.Nodes); {
		case n == 0:
			v.fail(p.field("nodes"), "required with lock.backend redlock: list an odd number of independent Redis masters (3 or more, usually 5)")
		case n < 3 || n%2 == 0:
			v.fail(p.field("nodes"), "must list an odd number of nodes, 3 or more (usually 5), got %d", n)
		}
		seen := map[string]int{}
		for i, addr := range l.Nodes {
			q := p.field("nodes").index(i, "")
			if err := checkHostPort(addr); err != nil {
				v.fail(q, "invalid address %q: %v", addr, err)
			} else if j, dup := seen[addr]; dup {
				v.fail(q, "duplicate node %q, also lock.nodes[%d]", addr, j)
			} else {
				seen[addr] = i
			}
		}
		if l.WaitReplicas > 0 {
			v.fail(p.field("wait_replicas"), "is not supported with lock.backend redlock, whose nodes are independent masters, got %d", l.WaitReplicas)
		}
		if l.TTL > 0 && l.NodeTimeout >= l.TTL {
			v.fail(p.field("node_timeout"), "must be less than lock.ttl (%v), got %v", l.TTL, l.NodeTimeout)
		}
	}
}

// checkEtcd checks lock.etcd for lock.backend etcd.
func (c *Common) checkEtcd(v *validator) {
	e, p := &c.Lock.Etcd, root.field("lock").field("etcd")
	if len(e.Endpoints) == 0 {
		v.fail(p.field("endpoints"), "required with lock.backend etcd: list the etcd members as host:port or http(s)://host:port")
	}
	seen := map[string]int{}
	for i, ep := range e.Endpoints {
		q := p.field("endpoints").index(i, "")
		scheme, hostPort, err := splitEndpoint(ep)
		switch {
		case err != nil:
			v.fail(q, "invalid endpoint %q: %v", ep, err)
		case scheme == "https" && !e.TLS.Enabled:
			v.fail(q, "endpoint %q is https but lock.etcd.tls.enabled is false", ep)
		case scheme == "http" && e.TLS.Enabled:
			v.fail(q, "endpoint %q is http but lock.etcd.tls.enabled is true", ep)
		default:
			if j, dup := seen[hostPort]; dup {
				v.fail(q, "duplicate endpoint %q, also lock.etcd.endpoints[%d]", ep, j)
			}
			seen[hostPort] = i
		}
	}
	atLeast(v, p.field("dial_timeout"), e.DialTimeout, 0)
	atLeast(v, p.field("election_timeout"), e.ElectionTimeout, 0)
	if l := &c.Lock; l.TTL > 0 && l.RenewInterval < l.TTL && e.ElectionTimeout >= 0 {
		election := cmp.Or(e.ElectionTimeout, DefaultEtcdElectionTimeout)
		if least := MinEtcdTTL(l.RenewInterval, election); l.TTL < least {
			renew := "ttl/3"
			if l.RenewInterval > 0 {
				renew = l.RenewInterval.String()
			}
			v.fail(root.field("lock").field("ttl"), "must be at least %v with lock.backend etcd: the renew interval (%s) "+
				"+ 2 × lock.etcd.election_timeout (%v), the longest a replaced etcd leader may still revoke leases; got %v",
				least, renew, election, l.TTL)
		}
	}
	checkPasswordFile(v, p, &e.Password, e.PasswordFile)
	switch {
	case e.Username != "" && e.Password == "" && e.PasswordFile == "":
		v.fail(p.field("password"), "required when lock.etcd.username is set (or set lock.etcd.password_file)")
	case e.Username == "" && (e.Password != "" || e.PasswordFile != ""):
		v.fail(p.field("username"), "required when lock.etcd.password or password_file is set")
	}
	checkTLS(v, p.field("tls"), e.TLS)
}

// splitEndpoint accepts host:port, http://host:port and https://host:port.
func splitEndpoint(ep string) (scheme, hostPort string, err error) {
	hostPort = ep
	if s, rest, ok := strings.Cut(ep, "://"); ok {
		if s != "http" && s != "https" {
			return "", "", fmt.Errorf("scheme %q is not http or https", s)
		}
		scheme, hostPort = s, strings.TrimSuffix(rest, "/")
	}
	if err := checkHostPort(hostPort); err != nil {
		return "", "", err
	}
	return scheme, hostPort, nil
}

func (c *Common) checkRedis(v *validator) {
	r, p := &c.Redis, root.field("redis")
	oneOf(v, p.field("mode"), r.Mode, RedisSingle, RedisSentinel, RedisCluster)
	switch r.Mode {
	case RedisSingle:
		if r.Addr == "" {
			v.fail(p.field("addr"), "required")
		} else if strings.HasPrefix(r.Addr, "/") {
			// a unix socket
		} else if err := checkHostPort(r.Addr); err != nil {
			v.fail(p.field("addr"), "invalid address %q: %v", r.Addr, err)
		}
		if len(r.Addrs) > 0 {
			v.fail(p.field("addrs"), "is only used with redis.mode sentinel or cluster; set redis.addr for a single server")
		}
	case RedisSentinel, RedisCluster:
		what := map[RedisMode]string{RedisSentinel: "the sentinels", RedisCluster: "the cluster's seed nodes"}[r.Mode]
		if r.Addr != "" {
			v.fail(p.field("addr"), "is not used with redis.mode %s: list %s in redis.addrs", r.Mode, what)
		}
		if len(r.Addrs) == 0 {
			v.fail(p.field("addrs"), "required with redis.mode %s: list %s as host:port", r.Mode, what)
		}
		for i, addr := range r.Addrs {
			if err := checkHostPort(addr); err != nil {
				v.fail(p.field("addrs").index(i, ""), "invalid address %q: %v", addr, err)
			}
		}
	}
	switch r.Mode {
	case RedisSentinel:
		if r.MasterName == "" {
			v.fail(p.field("master_name"), "required with redis.mode sentinel: the name the sentinels monitor the master by")
		}
	case RedisSingle, RedisCluster:
		for _, f := range []struct{ key, val string }{
			{"master_name", r.MasterName}, {"sentinel_username", r.SentinelUsername}, {"sentinel_password", string(r.SentinelPassword)},
		} {
			if f.val != "" {
				v.fail(p.field(f.key), "is only used with redis.mode sentinel (redis.mode is %q)", r.Mode)
			}
		}
	}
	if r.Mode == RedisCluster && r.DB != 0 {
		v.fail(p.field("db"), "must be 0 with redis.mode cluster (Redis Cluster has only database 0), got %d", r.DB)
	} else {
		atLeast(v, p.field("db"), r.DB, 0)
	}
	atLeast(v, p.field("dial_timeout"), r.DialTimeout, 0)
	atLeast(v, p.field("read_timeout"), r.ReadTimeout, 0)
	atLeast(v, p.field("write_timeout"), r.WriteTimeout, 0)
	atLeast(v, p.field("pool_size"), r.PoolSize, 0)

	checkPasswordFile(v, p, &r.Password, r.PasswordFile)
	checkTLS(v, p.field("tls"), r.TLS)
}

// checkPasswordFile reads password_file (of section p) into *pw, refusing
// both set at once.
func checkPasswordFile(v *validator, p fieldPath, pw *Secret, file string) {
	if file == "" {
		return
	}
	if *pw != "" {
		v.fail(p.field("password_file"), "cannot be set together with %s.password", p.show)
	} else if got, err := readPasswordFile(p.field("password_file").key, file); err != nil {
		v.addErr(err)
	} else {
		*pw = got
	}
}

// checkTLS checks a tls section p: its files are only set with enabled, a
// certificate comes with its key, and the files load.
func checkTLS(v *validator, p fieldPath, t TLSConfig) {
	for _, f := range []struct{ key, val string }{
		{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"server_name", t.ServerName},
	} {
		if !t.Enabled && f.val != "" {
			v.fail(p.field(f.key), "is set but %s.enabled is false", p.show)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.fail(p.field("key_file"), "required when %s.cert_file is set", p.show)
	case t.CertFile == "" && t.KeyFile != "":
		v.fail(p.field("cert_file"), "required when %s.key_file is set", p.show)
	case t.Enabled:
		if _, err := t.build(p.key); err != nil {
			v.addErr(err)
		}
	}
}

// checkHostPort accepts host:port with a numeric port; the host may be empty.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if ae, ok := errors.AsType[*net.AddrError](err); ok {
		return errors.New(ae.Err)
	} else if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("invalid port %q", port)
	}
	return nil
}

// readPasswordFile returns the file's contents without trailing newlines.
// Its errors name the file, never the contents.
func readPasswordFile(field, path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", &Error{Field: field, Msg: fmt.Sprintf("cannot read %q", path), Err: cause(err)}
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", &Error{Field: field, Msg: fmt.Sprintf("file %q is empty", path)}
	}
	return Secret(pw), nil
}

func required(v *validator, p fieldPath, key, val string) {
	if val == "" {
		v.fail(p.field(key), "required")
	}
}
