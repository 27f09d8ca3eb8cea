// Package tlsverify holds the one TLS rule two of quotad's clients share:
// verifying a server's certificate chain without its host name, for a
// Redis or memcached reached at an address its certificate does not name.
// It is pure: it imports only the standard library.
package tlsverify

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
)

// ChainOnly makes cfg verify the server's certificate chain against its
// RootCAs (the system's when nil) as crypto/tls does, but not the host
// name: crypto/tls checks both or, with InsecureSkipVerify, neither, so its
// own check is off and VerifyConnection does the chain's. A certificate
// whose chain does not verify still fails the handshake. server names the
// server in errors ("redis", "memcached"). Call it after RootCAs is set.
func ChainOnly(cfg *tls.Config, server string) {
	roots := cfg.RootCAs
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("tls: %s presented no certificate", server)
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("tls: failed to verify certificate (host name not checked): %w", err)
		}
		return nil
	}
}
