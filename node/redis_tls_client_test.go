package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/testpki"
	"github.com/quotad/quotad/node/store/redis"
)

// tlsRedis starts a redis-server serving TLS with server's certificate,
// signed by ca, which requires every client to present a certificate ca
// signed (tls-auth-clients yes), and returns it, its rediss:// URL on
// 127.0.0.1 and the CA's file.
func tlsRedis(t *testing.T, ca *testpki.CA, server testpki.Issued) (r *redistest.Server, url, caFile string) {
	t.Helper()
	r = redistest.Start(t, redistest.WithTLS(server.CertPEM, server.KeyPEM, ca.PEM, true))
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return r, "rediss://" + r.TLSAddr() + "/0", caFile
}

// writePair writes a certificate and its key to files of their own.
func writePair(t *testing.T, c testpki.Issued) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	if err := os.WriteFile(certFile, c.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, c.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// A TLS handshake under -race on a loaded machine can take longer than the
// default 1s, which would turn a certificate error into a timeout.
const tlsConnectTimeout = 10 * time.Second

// A Redis that requires client certificates refuses a store that presents
// none, and serves one that presents a certificate its CA signed.
func TestRedisTLSClientCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "redis ca")
	r, url, caFile := tlsRedis(t, ca, ca.Issue(t, "redis", true))
	ctx := context.Background()
	if s, err := redis.New(ctx, redis.Config{URL: url, TLSCAFile: caFile, ConnectTimeout: tlsConnectTimeout}); err == nil {
		s.Close()
		t.Fatal("a store without a client certificate started against a Redis that requires one")
	}
	if log, _ := os.ReadFile(filepath.Join(r.Dir(), "redis.log")); !strings.Contains(string(log), "certificate") {
		t.Errorf("the store without a client certificate failed, but redis-server's log does not say it sent none:\n%s", log)
	}
	certFile, keyFile := writePair(t, ca.Issue(t, "quotad", false))
	s, err := redis.New(ctx, redis.Config{URL: url, TLSCAFile: caFile, TLSCertFile: certFile, TLSKeyFile: keyFile,
		ConnectTimeout: tlsConnectTimeout, Timeout: time.Second})
	if err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	defer s.Close()
	checkFive(t, s)
}

// TLSSkipHostnameVerification serves a Redis whose certificate names
// another host (redis.internal, dialed as 127.0.0.1), which the host name
// check refuses; it still verifies the chain: a certificate signed by
// another CA is refused with it on.
func TestRedisTLSSkipHostnameVerificationStillVerifiesTheChain(t *testing.T) {
	ca := testpki.NewCA(t, "redis ca")
	_, url, caFile := tlsRedis(t, ca, ca.IssueFor(t, "redis", true, "redis.internal"))
	certFile, keyFile := writePair(t, ca.Issue(t, "quotad", false))
	ctx := context.Background()
	cfg := redis.Config{URL: url, TLSCAFile: caFile, TLSCertFile: certFile, TLSKeyFile: keyFile, ConnectTimeout: tlsConnectTimeout, Timeout: time.Second}
	if s, err := redis.New(ctx, cfg); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("host name checked: %v, want the error that the certificate does not name 127.0.0.1", err)
	}
	skip := cfg
	skip.TLSSkipHostnameVerification = true
	s, err := redis.New(ctx, skip)
	if err != nil {
		t.Fatalf("host name not checked: %v", err)
	}
	defer s.Close()
	checkFive(t, s)

	other := testpki.NewCA(t, "another ca")
	otherFile := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(otherFile, other.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	untrusted := skip
	untrusted.TLSCAFile = otherFile
	if s, err := redis.New(ctx, untrusted); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("host name not checked, chain of another CA: %v, want the chain refused", err)
	}
}

// The client certificate's settings are refused without TLS, or one
// without the other, with the line that says what to set.
func TestRedisTLSClientSettingsNeedTLS(t *testing.T) {
	for _, c := range []struct {
		cfg  redis.Config
		want string
	}{
		{redis.Config{URL: "redis://127.0.0.1:1/0", TLSCertFile: "/c", TLSKeyFile: "/k"}, "redis tls cert file: invalid config: /c given but the connection does not use TLS (rediss:// or TLS on)"},
		{redis.Config{URL: "rediss://127.0.0.1:1/0", TLSCertFile: "/c"}, `redis tls cert file: invalid config: a client certificate and its key go together (cert "/c", key ""): set both, or neither`},
		{redis.Config{URL: "redis://127.0.0.1:1/0", TLSSkipHostnameVerification: true}, "redis tls skip hostname verification: invalid config: on but the connection does not use TLS (rediss:// or TLS on)"},
	} {
		if err := c.cfg.Validate(); err == nil || err.Error() != c.want {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
}
