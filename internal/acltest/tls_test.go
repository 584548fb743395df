package acltest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// pki is a CA generated for one test, a server certificate for 127.0.0.1
// and a client certificate, written as PEM files into a private directory.
type pki struct {
	dir                 string
	ca, cert, key       string // server: CA bundle, certificate, key
	clientCert, clientK string
	pool                *x509.CertPool
	client              tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), pool: x509.NewCertPool()}
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lockstep test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p.pool.AddCert(caCert)
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)

	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (certFile, keyFile string, pair tls.Certificate) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", keyDER)
		pair, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return certFile, keyFile, pair
	}
	p.cert, p.key, _ = issue(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientK, p.client = issue(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsConfig is the test's own client side: the CA and the client certificate.
func (p *pki) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.client}, MinVersion: tls.VersionTLS12}
}

// TestWorkerOverTLS: a worker configured with redis.tls.* (the generated CA,
// a client certificate) runs a demo job on a Redis that speaks TLS only, and
// the CLI reads it the same way; without redis.tls.enabled the CLI cannot
// talk to it at all.
func TestWorkerOverTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	srv := redistest.StartTLS(t, redistest.TLS{Cert: p.cert, Key: p.key, CA: p.ca, Client: p.tlsConfig()})
	addr, c := srv.Addr, srv.Client()

	env := []string{
		"LOCKSTEP_REDIS_ADDR=" + addr,
		"LOCKSTEP_REDIS_TLS_ENABLED=true",
		"LOCKSTEP_REDIS_TLS_CA_FILE=" + p.ca,
		"LOCKSTEP_REDIS_TLS_CERT_FILE=" + p.clientCert,
		"LOCKSTEP_REDIS_TLS_KEY_FILE=" + p.clientK,
	}
	w := startBinary(t, "worker", env, "--config", proctest.WriteFile(t, "worker.yaml", workerConfig))
	w.metricsAddr(t)

	payload, err := json.Marshal(map[string]any{"order_id": "tls-1", "work_ms": 10})
	if err != nil {
		t.Fatal(err)
	}
	enq := asynq.NewClientFromRedisClient(c)
	t.Cleanup(func() { _ = enq.Close() })
	if _, err := enq.Enqueue(asynq.NewTask("demo:order.pay", payload), asynq.Queue("default")); err != nil {
		t.Fatal(err)
	}
	waitDemoOK(t, c, 1, 30*time.Second)

	if code, out := runCLI(t, env, "schedules", "--json"); code != 0 && code != 1 {
		t.Errorf("lockstep schedules over TLS: exit %d:\n%s", code, out)
	}
	if code, out := runCLI(t, env[:1], "locks"); code == 0 || code == 1 {
		t.Errorf("lockstep locks without redis.tls: exit %d, want a failure to reach a TLS-only Redis:\n%s", code, out)
	}
}
