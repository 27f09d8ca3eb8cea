package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
)

// tlsConfig makes the API port serve TLS. The zero value serves cleartext:
// HTTP/1.1 and h2c.
type tlsConfig struct {
	// CertFile and KeyFile are PEM files: the server's certificate chain
	// (leaf first) and its private key. Both or neither. Set, the port
	// serves TLS only, HTTP/2 by ALPN and HTTP/1.1. Both are re-read when
	// either changes on disk (see certReloader).
	CertFile, KeyFile string
	// ClientCAFile is a PEM file of the certificate authorities that sign
	// client certificates. Set, every client must present a certificate
	// one of them signed (mutual TLS); needs CertFile. Re-read like the
	// certificate.
	ClientCAFile string
	// ClientSAN, set, is a name every client certificate must carry among
	// its subject alternative names as well: a DNS name (matched as a
	// host name is, a certificate's *.example wildcard included) or, when
	// it is an IP address, an IP address. Needs ClientCAFile.
	ClientSAN string
}

// enabled reports whether the API serves TLS.
func (c tlsConfig) enabled() bool { return c.CertFile != "" }

// validate checks that the files exist and hold what they should, so that
// a bad file stops quotad at start rather than failing every handshake.
func (c tlsConfig) validate() error {
	switch {
	case c.ClientSAN != "" && c.ClientCAFile == "":
		return fmt.Errorf("tls: --tls-client-san %s needs --tls-client-ca-file (a client certificate's name is checked once its CA has signed it)", c.ClientSAN)
	case c.CertFile == "" && c.KeyFile == "" && c.ClientCAFile == "":
		return nil
	case c.CertFile == "" && c.KeyFile == "":
		return errors.New("tls: --tls-client-ca-file needs --tls-cert-file and --tls-key-file (mutual TLS is TLS first)")
	case c.CertFile == "" || c.KeyFile == "":
		return errors.New("tls: --tls-cert-file and --tls-key-file go together (set both, or neither for cleartext)")
	}
	_, err := c.load()
	return err
}

// load reads the files into the configuration of one handshake: TLS 1.2
// or newer, ALPN offering h2 then http/1.1, and client certificates
// required when ClientCAFile is set (naming ClientSAN, when set).
func (c tlsConfig) load() (*tls.Config, error) {
	pair, err := loadKeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: certificate %s with key %s: %w", c.CertFile, c.KeyFile, err)
	}
	tc := &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}
	if c.ClientCAFile != "" {
		raw, err := readFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("tls: client CA file %s: no PEM certificate in it", c.ClientCAFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		if c.ClientSAN != "" {
			tc.VerifyPeerCertificate = requireClientSAN(c.ClientSAN)
		}
	}
	return tc, nil
}

// requireClientSAN is a tls.Config.VerifyPeerCertificate that refuses a
// client certificate, already verified against the client CAs, unless it
// carries san among its subject alternative names, as x509 matches a host
// name (envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN).
func requireClientSAN(san string) func([][]byte, [][]*x509.Certificate) error {
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		if len(chains) == 0 || len(chains[0]) == 0 {
			return errors.New("tls: no verified client certificate")
		}
		if err := chains[0][0].VerifyHostname(san); err != nil {
			return fmt.Errorf("tls: client certificate does not carry the name %s: %w", san, err)
		}
		return nil
	}
}

// loadKeyPair is tls.LoadX509KeyPair, reading the files as quotad reads
// every file (readFile).
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := readFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := readFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}

// describe is the startup line about TLS, or "" for cleartext.
func (c tlsConfig) describe() string {
	switch {
	case !c.enabled():
		return ""
	case c.ClientSAN != "":
		return "tls: on, client certificates naming " + c.ClientSAN + " required (mutual TLS)"
	case c.ClientCAFile != "":
		return "tls: on, client certificates required (mutual TLS)"
	}
	return "tls: on"
}

// certReloader hands each new TLS connection the configuration built from
// the files as they are at its handshake. It stats the files on every
// handshake (a few microseconds, next to a handshake's milliseconds) and
// reloads them when one has changed: another inode (a Kubernetes Secret
// update swaps a symlink; cert-manager and editors rename a new file into
// place), size or modification time. A change that does not load (a
// certificate written before its key) keeps the last good configuration
// and is logged once; the next change is tried again. Connections already
// open keep the certificate they were made with. Safe for concurrent use.
type certReloader struct {
	cfg tlsConfig
	log *slog.Logger

	mu      sync.Mutex
	seen    []fs.FileInfo // the files' state at the last load attempt
	current *tls.Config   // never nil
}

// newCertReloader loads cfg's files once; an error means they do not load
// now.
func newCertReloader(cfg tlsConfig, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{cfg: cfg, log: log}
	r.seen = r.stat()
	tc, err := cfg.load()
	if err != nil {
		return nil, err
	}
	r.current = tc
	return r, nil
}

func (r *certReloader) files() []string {
	f := []string{r.cfg.CertFile, r.cfg.KeyFile}
	if r.cfg.ClientCAFile != "" {
		f = append(f, r.cfg.ClientCAFile)
	}
	return f
}

// stat returns the files' state; a file that cannot be stat'ed is nil.
func (r *certReloader) stat() []fs.FileInfo {
	files := r.files()
	out := make([]fs.FileInfo, len(files))
	for i, f := range files {
		out[i], _ = os.Stat(f) // a missing file is a change like any other
	}
	return out
}

func sameFile(a, b fs.FileInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// configForClient is tls.Config.GetConfigForClient.
func (r *certReloader) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	now := r.stat()
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for i := range now {
		if !sameFile(now[i], r.seen[i]) {
			changed = true
		}
	}
	if !changed {
		return r.current, nil
	}
	r.seen = now
	tc, err := r.cfg.load()
	if err != nil {
		r.log.Warn("tls: files changed but do not load; still serving the previous certificate", "err", err)
		return r.current, nil
	}
	r.current = tc
	attrs := []any{"cert_file", r.cfg.CertFile}
	if leaf, err := x509.ParseCertificate(tc.Certificates[0].Certificate[0]); err == nil {
		attrs = append(attrs, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
	}
	r.log.Info("tls: certificate reloaded", attrs...)
	return tc, nil
}

// apiTLS is the API port's TLS configuration from cfg's files, reloaded
// as they change, and the one this
// node asks the other members' API with (GET /status?scope=cluster),
// both nil when cfg does not enable TLS. Members are taken to share the
// node's TLS setup: a member's certificate is trusted when the system's
// roots, the certificates of --tls-client-ca-file or those of
// --tls-cert-file (a shared certificate, or a chain that holds its CA)
// sign it, for the member's gossip host; and the node presents its own
// certificate, as reloaded, to members that require one. The roots are
// read once, at start.
func apiTLS(cfg tlsConfig, logger *slog.Logger) (server, members *tls.Config, err error) {
	if !cfg.enabled() {
		return nil, nil, nil
	}
	r, err := newCertReloader(cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	for _, f := range []string{cfg.CertFile, cfg.ClientCAFile} {
		if f == "" {
			continue
		}
		raw, err := readFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("tls: %w", err)
		}
		roots.AppendCertsFromPEM(raw)
	}
	members = &tls.Config{
		RootCAs:    roots,
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			tc, err := r.configForClient(nil)
			if err != nil {
				return nil, err
			}
			return &tc.Certificates[0], nil
		},
	}
	return &tls.Config{GetConfigForClient: r.configForClient, NextProtos: []string{"h2", "http/1.1"}}, members, nil
}
