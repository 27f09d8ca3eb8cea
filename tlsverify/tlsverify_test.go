package tlsverify_test

import (
	"crypto/tls"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/testpki"
	"github.com/quotad/quotad/tlsverify"
)

// handshake dials a TLS server on loopback that presents cert, with
// client, and returns the client's handshake error.
func handshake(t *testing.T, cert tls.Certificate, client *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err == nil {
		conn.Close()
	}
	return err
}

// TestChainOnlyChecksTheChainNotTheName requires that a server whose
// certificate names another host is accepted when its chain verifies, and
// refused when the chain is another authority's, while the default check
// refuses the name.
func TestChainOnlyChecksTheChainNotTheName(t *testing.T) {
	ca, other := testpki.NewCA(t, "ca"), testpki.NewCA(t, "other")
	elsewhere := ca.IssueFor(t, "cache", true, "cache.internal.example")

	if err := handshake(t, elsewhere.Pair, &tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Fatal("the default check accepted a certificate for another host name")
	}

	cfg := &tls.Config{RootCAs: ca.Pool()}
	tlsverify.ChainOnly(cfg, "redis")
	if err := handshake(t, elsewhere.Pair, cfg); err != nil {
		t.Fatalf("a chain that verifies, for another host name: %v", err)
	}

	cfg = &tls.Config{RootCAs: other.Pool()}
	tlsverify.ChainOnly(cfg, "redis")
	err := handshake(t, elsewhere.Pair, cfg)
	if err == nil || !strings.Contains(err.Error(), "host name not checked") {
		t.Fatalf("a chain of another authority: %v, want it refused", err)
	}
}
