package node_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// checkFive runs the five-a-minute limit through a node on store: five
// allowed from the store, the sixth denied.
func checkFive(t *testing.T, store node.Store) {
	t.Helper()
	n := newNode(t, store, node.Config{})
	p := node.Policy{Name: "auth", Limit: fiveAMinute, Lease: node.LeaseOff}
	for i := range 6 {
		res, err := n.Check(context.Background(), p, "k", 1)
		if err != nil || res.Source != node.SourceStore || res.Allowed != (i < 5) {
			t.Fatalf("check %d: %+v, %v", i+1, res, err)
		}
	}
}

// A password (requirepass) and an ACL user work in the URL; a wrong
// password keeps the store from starting, with Redis's reason.
func TestRedisAuth(t *testing.T) {
	r := redistest.Start(t)
	if _, err := r.Do("ACL", "SETUSER", "quotad", "on", ">s3cret", "~*", "+@all"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	user, err := redis.New(ctx, redis.Config{URL: "redis://quotad:s3cret@" + r.Addr() + "/0", Timeout: time.Second})
	if err != nil {
		t.Fatalf("ACL user: %v", err)
	}
	checkFive(t, user)

	if _, err := redis.New(ctx, redis.Config{URL: "redis://quotad:wrong@" + r.Addr() + "/0"}); err == nil ||
		!strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: %v, want WRONGPASS", err)
	}

	if _, err := r.Do("CONFIG", "SET", "requirepass", "hunter2"); err != nil {
		t.Fatal(err)
	}
	if _, err := redis.New(ctx, redis.Config{URL: r.URL()}); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("no password: %v, want NOAUTH", err)
	}
	pass, err := redis.New(ctx, redis.Config{URL: "redis://:hunter2@" + r.Addr() + "/1", Timeout: time.Second})
	if err != nil {
		t.Fatalf("requirepass: %v", err)
	}
	checkFive(t, pass)
}

// rediss:// with a private CA: trusted through TLSCAFile, refused without it.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	redistest.Start(t, redistest.WithArgs(
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no",
	))
	url := "rediss://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/0"
	ctx := context.Background()
	// A TLS handshake under -race on a loaded machine can take longer than
	// the default 1s, which would turn the certificate error into a
	// timeout.
	const connect = 10 * time.Second
	if _, err := redis.New(ctx, redis.Config{URL: url, ConnectTimeout: connect}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted CA: %v, want a certificate error", err)
	}
	s, err := redis.New(ctx, redis.Config{URL: url, TLSCAFile: caFile, ConnectTimeout: connect, Timeout: time.Second})
	if err != nil {
		t.Fatalf("trusted CA: %v", err)
	}
	if d := s.Describe(); !strings.Contains(d, "tls") {
		t.Errorf("Describe() = %q, want it to say tls", d)
	}
	checkFive(t, s)
}

// A rediss:// URL that points at a Redis without TLS fails to start with
// an error that says TLS failed with that server and how to fix the URL,
// not with the deadline of the command that waited for the connection
// (which errors.Is still finds).
func TestRedissToAPlainRedisSaysTLSFailed(t *testing.T) {
	r := redistest.Start(t)
	_, err := redis.New(context.Background(), redis.Config{URL: "rediss://" + r.Addr() + "/0", ConnectTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("rediss:// to a Redis without TLS started")
	}
	want := "TLS with redis at " + r.Addr() + " failed: the handshake got no answer, and " + r.Addr() + " answers plaintext Redis commands, so it does not speak TLS; use redis://"
	if msg := err.Error(); !strings.HasPrefix(msg, want) || strings.Contains(msg, "context deadline exceeded") {
		t.Fatalf("error %q; want it to start %q, without the deadline's words", msg, want)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %q does not unwrap to context.DeadlineExceeded", err)
	}
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 signed by
// it, and returns their PEM files.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "quotad test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}
