package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const secret = "hunter2-s3cret"

// Secrets must not reach errors, whatever else is wrong with the config.
func TestSecretsNotInErrors(t *testing.T) {
	t.Parallel()
	pwFile := writeFile(t, "pw", secret+"\n")
	tests := []struct {
		name string
		yaml string
		env  map[string]string
	}{
		{"password with bad fields", "redis:\n  addr: nope\n  password: " + secret + "\n  db: -1\nworker:\n  concurrency: 0\n", nil},
		{"password decode error", "redis:\n  password: " + secret + "\n  dial_timeout: x\n", nil},
		{"password as list", "redis:\n  addr: a:1\n  password: [" + secret + "]\n", nil},
		{"password and file", "redis:\n  addr: a:1\n  password: " + secret + "\n  password_file: " + pwFile + "\n", nil},
		{"file with bad fields", "redis:\n  addr: a:1\n  password_file: " + pwFile + "\nlog:\n  level: loud\n", nil},
		{"env password", "redis:\n  addr: a:1\nlock:\n  ttl: 0s\n", map[string]string{"LOCKSTEP_REDIS_PASSWORD": secret, "LOCKSTEP_REDIS_PASSWORD_FILE": pwFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := LoadWorker(writeFile(t, "w.yaml", tt.yaml), envMap(tt.env))
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("secret in error: %v", err)
			}
		})
	}
}

// Secrets must not reach any printed or logged form of a loaded config.
func TestSecretsRedacted(t *testing.T) {
	t.Parallel()
	c := loadWorker(t, "redis:\n  addr: a:1\n  username: app\n  password: "+secret+"\n")
	var logs bytes.Buffer
	for _, h := range []slog.Handler{slog.NewJSONHandler(&logs, nil), slog.NewTextHandler(&logs, nil)} {
		slog.New(h).Info("loaded", "redis", c.Redis, "config", c, "ptr", &c.Redis, "password", c.Redis.Password)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	ym, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"logs": logs.String(), "json": string(js), "yaml": string(ym),
		"String": c.Redis.String(), "%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c),
		"%s password": fmt.Sprintf("%s", c.Redis.Password), "%q password": fmt.Sprintf("%q", c.Redis.Password),
		"%x password": fmt.Sprintf("%x", c.Redis.Password),
	}
	for name, out := range outputs {
		if strings.Contains(out, secret) {
			t.Errorf("%s shows the secret: %s", name, out)
		}
		if !strings.Contains(out, redacted) && !strings.Contains(out, fmt.Sprintf("%x", redacted)) {
			t.Errorf("%s does not say the password is set: %s", name, out)
		}
	}
	if got, want := c.Redis.String(), "addr=a:1 db=0 username=app password=[redacted] tls=false"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if Secret("").String() != "" {
		t.Error("an empty secret should print empty")
	}
}

func TestRedisLogValue(t *testing.T) {
	t.Parallel()
	r := RedisConfig{Addr: "a:1", DB: 2, Password: secret, DialTimeout: time.Second}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "redis", r)
	for _, want := range []string{"redis.addr=a:1", "redis.db=2", "redis.password=[redacted]", "redis.tls=false", "redis.dial_timeout=1s"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %q lacks %q", buf.String(), want)
		}
	}
}

func TestRedisOptions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, cert, key := writeTLSFiles(t, dir)
	r := RedisConfig{
		Addr: "redis:6380", DB: 4, Username: "app", PasswordFile: writeFile(t, "pw", secret+"\n"),
		TLS:         TLSConfig{Enabled: true, CAFile: ca, CertFile: cert, KeyFile: key, ServerName: "redis.internal"},
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, PoolSize: 7,
	}
	u, err := r.UniversalOptions()
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Addrs) != 1 || u.Addrs[0] != "redis:6380" || u.DB != 4 || u.Username != "app" || u.Password != secret ||
		u.DialTimeout != time.Second || u.ReadTimeout != 2*time.Second || u.WriteTimeout != 3*time.Second || u.PoolSize != 7 {
		t.Errorf("UniversalOptions = %+v", u)
	}
	if u.TLSConfig == nil || u.TLSConfig.ServerName != "redis.internal" || u.TLSConfig.RootCAs == nil || len(u.TLSConfig.Certificates) != 1 {
		t.Errorf("TLSConfig = %+v", u.TLSConfig)
	}

	// A Redlock node gets the same settings, for its own address.
	n, err := r.NodeOptions("node:7000")
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr != "node:7000" || n.DB != 4 || n.Username != "app" || n.Password != secret || n.DialTimeout != time.Second ||
		n.ReadTimeout != 2*time.Second || n.WriteTimeout != 3*time.Second || n.PoolSize != 7 || !n.ContextTimeoutEnabled ||
		n.TLSConfig == nil || n.TLSConfig.ServerName != "redis.internal" {
		t.Errorf("NodeOptions = %+v", n)
	}

	plain, err := RedisConfig{Addr: "r:1"}.UniversalOptions()
	if err != nil || plain.TLSConfig != nil || plain.Password != "" {
		t.Errorf("plain = %+v, %v", plain, err)
	}
	if _, err := (RedisConfig{Addr: "r:1", PasswordFile: filepath.Join(dir, "nope")}).UniversalOptions(); err == nil {
		t.Error("UniversalOptions read a missing password file")
	}

	// The same files pass validation at load.
	yml := fmt.Sprintf("redis:\n  addr: a:1\n  tls:\n    enabled: true\n    ca_file: %s\n    cert_file: %s\n    key_file: %s\n", ca, cert, key)
	if _, err := LoadWorker(writeFile(t, "w.yaml", yml), nil); err != nil {
		t.Error(err)
	}
}

// writeTLSFiles writes a self-signed CA and a client certificate with its key.
func writeTLSFiles(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cert = write("cert.pem", "CERTIFICATE", der)
	return cert, cert, write("key.pem", "EC PRIVATE KEY", kder)
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		c          LogConfig
		wantPrefix string
		wantDebug  bool
	}{
		{LogConfig{Format: "json", Level: "info"}, `{"time":`, false},
		{LogConfig{Format: "text", Level: "debug"}, "time=", true},
		{LogConfig{}, `{"time":`, false},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		log := NewLogger(tt.c, &buf)
		log.Debug("debug-line")
		log.Warn("warn-line")
		if !strings.HasPrefix(buf.String(), tt.wantPrefix) || !strings.Contains(buf.String(), "warn-line") {
			t.Errorf("%+v: output %q", tt.c, buf.String())
		}
		if got := strings.Contains(buf.String(), "debug-line"); got != tt.wantDebug {
			t.Errorf("%+v: debug logged = %v, want %v", tt.c, got, tt.wantDebug)
		}
	}
}
