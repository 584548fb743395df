package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Secret is a string that does not show itself: fmt, slog, encoding/json and
// YAML print "[redacted]" (or "" when it is empty). Convert it with string()
// only to hand it to a client.
type Secret string

const redacted = "[redacted]"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

func (s Secret) GoString() string             { return strconv.Quote(s.String()) }
func (s Secret) LogValue() slog.Value         { return slog.StringValue(s.String()) }
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// String summarises the connection settings without the passwords.
func (r RedisConfig) String() string {
	var b strings.Builder
	if r.Mode != "" && r.Mode != RedisSingle {
		fmt.Fprintf(&b, "mode=%s addrs=%s ", r.Mode, strings.Join(r.Addrs, ","))
		if r.MasterName != "" {
			fmt.Fprintf(&b, "master_name=%s ", r.MasterName)
		}
		fmt.Fprintf(&b, "db=%d", r.DB)
	} else {
		fmt.Fprintf(&b, "addr=%s db=%d", r.Addr, r.DB)
	}
	if r.Username != "" {
		fmt.Fprintf(&b, " username=%s", r.Username)
	}
	if r.Password != "" {
		b.WriteString(" password=" + redacted)
	}
	if r.PasswordFile != "" {
		fmt.Fprintf(&b, " password_file=%s", r.PasswordFile)
	}
	if r.SentinelUsername != "" {
		fmt.Fprintf(&b, " sentinel_username=%s", r.SentinelUsername)
	}
	if r.SentinelPassword != "" {
		b.WriteString(" sentinel_password=" + redacted)
	}
	fmt.Fprintf(&b, " tls=%t", r.TLS.Enabled)
	return b.String()
}

// LogValue logs the connection settings without the passwords.
func (r RedisConfig) LogValue() slog.Value {
	var attrs []slog.Attr
	if r.Mode != "" && r.Mode != RedisSingle {
		attrs = append(attrs, slog.String("mode", string(r.Mode)), slog.Any("addrs", r.Addrs))
		if r.MasterName != "" {
			attrs = append(attrs, slog.String("master_name", r.MasterName))
		}
	} else {
		attrs = append(attrs, slog.String("addr", r.Addr))
	}
	attrs = append(attrs, slog.Int("db", r.DB))
	if r.Username != "" {
		attrs = append(attrs, slog.String("username", r.Username))
	}
	if r.Password != "" {
		attrs = append(attrs, slog.String("password", redacted))
	}
	if r.PasswordFile != "" {
		attrs = append(attrs, slog.String("password_file", r.PasswordFile))
	}
	if r.SentinelUsername != "" {
		attrs = append(attrs, slog.String("sentinel_username", r.SentinelUsername))
	}
	if r.SentinelPassword != "" {
		attrs = append(attrs, slog.String("sentinel_password", redacted))
	}
	attrs = append(attrs,
		slog.Bool("tls", r.TLS.Enabled),
		slog.Duration("dial_timeout", r.DialTimeout),
		slog.Duration("read_timeout", r.ReadTimeout),
		slog.Duration("write_timeout", r.WriteTimeout),
		slog.Int("pool_size", r.PoolSize),
	)
	return slog.GroupValue(attrs...)
}

// UniversalOptions returns go-redis options for this Redis, of the kind its
// mode needs: redis.NewUniversalClient makes a plain client for single, a
// failover client (the master found through the sentinels) for sentinel and
// a Cluster client for cluster. Zero timeouts and pool size leave go-redis
// defaults.
func (r RedisConfig) UniversalOptions() (*redis.UniversalOptions, error) {
	o, err := r.serverOptions(r.Addr)
	if err != nil {
		return nil, err
	}
	switch r.Mode {
	case RedisSentinel:
		o.Addrs = slices.Clone(r.Addrs)
		o.MasterName = r.MasterName
		o.SentinelUsername = r.SentinelUsername
		o.SentinelPassword = string(r.SentinelPassword)
	case RedisCluster:
		o.Addrs = slices.Clone(r.Addrs)
		o.IsClusterMode = true // a Cluster client even with one seed address
	}
	return o, nil
}

// NewClient returns the one kind of client every role uses for this Redis:
// redis.NewUniversalClient on UniversalOptions, so context deadlines bound
// every call. The caller closes it.
func (r RedisConfig) NewClient() (redis.UniversalClient, error) {
	opts, err := r.UniversalOptions()
	if err != nil {
		return nil, err
	}
	c := redis.NewUniversalClient(opts)
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.AddHook(reloadOnFailure{cc})
	}
	return c, nil
}

// reloadOnFailure is a Cluster client's hook that rereads the Cluster's
// slots (CLUSTER SLOTS, in the background, at most one read every 200 ms)
// after a command fails in a way a failover explains: the node could not be
// reached or did not answer in time, or it answered CLUSTERDOWN, MASTERDOWN
// or TRYAGAIN. go-redis rereads them by itself only on a MOVED or ASK reply
// and once a minute (ClusterStateReloadInterval): a master that is gone
// sends neither, so without this the client keeps sending its slots'
// commands to the dead master until the minute is up, long after its
// replica was promoted.
type reloadOnFailure struct{ c *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if topologyMayHaveChanged(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if topologyMayHaveChanged(cmd.Err()) {
				h.c.ReloadState(ctx)
				break
			}
		}
		return err
	}
}

// topologyMayHaveChanged reports whether err is one a Cluster node's
// failure or a failover under way gives: any error but a reply of the
// server's (a network error, a timeout), or a reply saying the Cluster or
// the master is down. A caller's cancellation and redis.Nil are not.
func topologyMayHaveChanged(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	for _, p := range []string{"CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN"} {
		if strings.HasPrefix(reply.Error(), p) {
			return true
		}
	}
	return false
}

// NodeOptions returns go-redis options for one server at addr (a Redlock node)
// with this section's credentials, TLS, timeouts and pool size.
func (r RedisConfig) NodeOptions(addr string) (*redis.Options, error) {
	o, err := r.serverOptions(addr)
	if err != nil {
		return nil, err
	}
	return o.Simple(), nil
}

// serverOptions returns the options for one server at addr that every mode
// shares: credentials, TLS, timeouts, pool size.
func (r RedisConfig) serverOptions(addr string) (*redis.UniversalOptions, error) {
	pw, t, err := r.credentials()
	if err != nil {
		return nil, err
	}
	return &redis.UniversalOptions{
		Addrs:        []string{addr},
		DB:           r.DB,
		Username:     r.Username,
		Password:     pw,
		DialTimeout:  r.DialTimeout,
		ReadTimeout:  r.ReadTimeout,
		WriteTimeout: r.WriteTimeout,
		PoolSize:     r.PoolSize,
		TLSConfig:    t,
		// Context deadlines bound every call: the watchdog relies on it so a
		// renewal round never outlives the leases' local deadline.
		ContextTimeoutEnabled: true,
	}, nil
}

// credentials returns the password (reading PasswordFile if the config was
// built by hand rather than loaded) and the TLS configuration.
func (r RedisConfig) credentials() (string, *tls.Config, error) {
	if r.Password == "" && r.PasswordFile != "" {
		pw, err := readPasswordFile("redis.password_file", r.PasswordFile)
		if err != nil {
			return "", nil, err
		}
		r.Password = pw
	}
	t, err := r.TLS.build("redis.tls")
	return string(r.Password), t, err
}

// build returns the TLS client configuration, or nil when TLS is off.
// Errors are *Error naming the field (under key, e.g. "redis.tls") and file,
// never file contents.
func (t TLSConfig) build(key string) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &Error{Field: key + ".ca_file", Msg: fmt.Sprintf("cannot read %q", t.CAFile), Err: cause(err)}
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &Error{Field: key + ".ca_file", Msg: fmt.Sprintf("no PEM certificate in %q", t.CAFile)}
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &Error{Field: key + ".cert_file", Msg: fmt.Sprintf("cannot load key pair %q, %q", t.CertFile, t.KeyFile), Err: cause(err)}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
