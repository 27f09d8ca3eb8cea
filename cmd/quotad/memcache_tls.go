package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/quotad/quotad/tlsverify"
)

// This file is TLS to memcached (--memcache-tls and its files): the
// settings, their checks, and the client's tls.Config, its files read as
// quotad reads every file (readFile).

// memcacheTLSConfig is how quotad speaks TLS to memcached; the zero value
// is cleartext.
type memcacheTLSConfig struct {
	// Enabled makes every connection to memcached TLS.
	Enabled bool
	// CAFile is a PEM file of the authorities to trust instead of the
	// system's; empty trusts the system's.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (PEM)
	// presented to memcached; both or neither.
	CertFile, KeyFile string
	// SkipHostnameVerification verifies memcached's certificate chain but
	// not that it names the host dialed.
	SkipHostnameVerification bool
}

// validate checks the TLS settings against whether memcached is used.
func (c memcacheTLSConfig) validate(usesMemcache bool) error {
	files := c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.SkipHostnameVerification
	switch {
	case (c.Enabled || files) && !usesMemcache:
		return errors.New("memcache: --memcache-tls and its files are set but no memcached is (set --memcache)")
	case files && !c.Enabled:
		return errors.New("memcache: --memcache-tls-ca, --memcache-tls-cert-file, --memcache-tls-key-file and --memcache-tls-skip-hostname-verification need --memcache-tls")
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("memcache: --memcache-tls-cert-file and --memcache-tls-key-file go together: set both, or neither")
	}
	return nil
}

// load returns the client's tls.Config, nil when TLS is off. A file that
// cannot be read, or holds no certificate, is an error naming it.
func (c memcacheTLSConfig) load() (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := readFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("memcache tls ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("memcache tls ca file %s: no PEM certificate in it", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		pair, err := loadKeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("memcache tls cert file %s with key file %s: %w (want the PEM certificate and the PEM private key that goes with it)", c.CertFile, c.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if c.SkipHostnameVerification {
		tlsverify.ChainOnly(cfg, "memcached")
	}
	return cfg, nil
}
