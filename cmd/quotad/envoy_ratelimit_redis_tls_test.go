package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/testpki"
)

// writeIn writes data to name in dir and returns its path.
func writeIn(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY present a client
// certificate to a Redis that requires one, and
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true reaches a Redis whose
// certificate names another host (redis.internal, dialed as 127.0.0.1):
// the built binary counts in that Redis (the third request of a limit of
// two is over it, and the Redis holds keys). Without the certificate, or
// with the host name checked, quotad stops at start.
func TestEnvoyRatelimitRedisClientCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "redis ca")
	server := ca.IssueFor(t, "redis", true, "redis.internal")
	r := redistest.Start(t, redistest.WithTLS(server.CertPEM, server.KeyPEM, ca.PEM, true))
	dir := t.TempDir()
	client := ca.Issue(t, "quotad", false)
	tlsEnv := []string{"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.TLSAddr(), "REDIS_TLS=true",
		"REDIS_TLS_CACERT=" + writeIn(t, dir, "ca.pem", ca.PEM), "REDIS_TIMEOUT=10s"}
	certEnv := []string{"REDIS_TLS_CLIENT_CERT=" + writeIn(t, dir, "client.crt", client.CertPEM),
		"REDIS_TLS_CLIENT_KEY=" + writeIn(t, dir, "client.key", client.KeyPEM)}
	skipEnv := []string{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"}

	p := startRatelimit(t, ratelimitRule("2"), append(append(tlsEnv, certEnv...), skipEnv...)...)
	for i, want := range []int{200, 200, 429} {
		if got := p.askJSON(t); got != want {
			t.Fatalf("/json %d: %d, want %d\n%s", i+1, got, want, p.stderr.tail())
		}
	}
	if n, err := r.Do("DBSIZE"); err != nil || n == "0" {
		t.Errorf("DBSIZE %q (%v): the counts are not in the Redis reached over TLS", n, err)
	}

	if out := ratelimitFails(t, ratelimitRule("2"), append(tlsEnv, skipEnv...)...); !strings.Contains(out, "quotad: redis store: ") {
		t.Errorf("without a client certificate it stopped, but does not say it was Redis:\n%s", out)
	}
	if out := ratelimitFails(t, ratelimitRule("2"), append(tlsEnv, certEnv...)...); !strings.Contains(out, "127.0.0.1") {
		t.Errorf("with the host name checked, it stopped without saying the certificate does not name 127.0.0.1:\n%s", out)
	}
}
