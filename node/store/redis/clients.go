package redis

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/tlsverify"
)

// This file builds the go-redis clients for a Config: a single server, a
// Redis Cluster or Sentinel, with TLS, and never resending a command.

// newClients builds the clients for cfg (validated) and describes them
// without secrets.
//
// No client resends a command after a connection error: a script whose
// reply was lost may have run, and a release run twice would hand back its
// units twice (a check run twice only spends twice, which under-admits).
// Single servers and Sentinel have MaxRetries off. The Cluster client also
// resends on MOVED and ASK, which it needs to follow slot moves, and it
// counts connection-error resends in the same budget; so checks, which may
// safely run twice, use a client that follows redirects, and releases use
// one with MaxRedirects off: a release that meets a moving slot fails and
// its units stay spent.
func newClients(cfg Config) (checks, releases goredis.UniversalClient, describe string, err error) {
	var tlsConfig *tls.Config
	if cfg.TLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.URL != "" {
		opts, _ := goredis.ParseURL(cfg.URL) // validated
		tlsConfig = opts.TLSConfig
		if err := withTLSFiles(tlsConfig, cfg); err != nil {
			return nil, nil, "", err
		}
		opts.MaxRetries = -1
		opts.ContextTimeoutEnabled = true
		// The breaker, not the dialer, decides how often a down server is
		// tried.
		opts.DialerRetries = 1
		opts.DialTimeout = cfg.ConnectTimeout
		opts.DisableIdentity = true // see the UniversalOptions below
		// Unless the URL sets pool_size.
		if opts.PoolSize == 0 {
			opts.PoolSize = poolSize
		}
		describe = fmt.Sprintf("redis %s db %d", opts.Addr, opts.DB)
		if tlsConfig != nil {
			describe += " (tls)"
		}
		c := goredis.NewClient(opts)
		return c, c, describe, nil
	}
	if err := withTLSFiles(tlsConfig, cfg); err != nil {
		return nil, nil, "", err
	}
	u := &goredis.UniversalOptions{
		Addrs:                 slices.Clone(cfg.ClusterAddrs),
		Username:              cfg.Username,
		Password:              cfg.Password,
		TLSConfig:             tlsConfig,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           cfg.ConnectTimeout,
		PoolSize:              poolSize,
		// CLIENT SETINFO only labels the connection in CLIENT LIST, and it
		// costs every new connection one more round trip.
		DisableIdentity: true,
		// Primaries only: ReadOnly, RouteByLatency and RouteRandomly
		// would send reads to replicas, and every script writes anyway.
		ReadOnly:       false,
		RouteByLatency: false,
		RouteRandomly:  false,
	}
	suffix := ""
	if tlsConfig != nil {
		suffix = " (tls)"
	}
	if len(cfg.ClusterAddrs) > 0 {
		checks := goredis.NewClusterClient(u.Cluster())
		noResend := u.Cluster()
		noResend.MaxRedirects = -1
		return checks, goredis.NewClusterClient(noResend), "redis cluster " + strings.Join(cfg.ClusterAddrs, ",") + suffix, nil
	}
	u.Addrs = slices.Clone(cfg.SentinelAddrs)
	u.MasterName = cfg.MasterName
	u.SentinelUsername = cfg.SentinelUsername
	u.SentinelPassword = cfg.SentinelPassword
	u.DB = cfg.DB
	c := goredis.NewFailoverClient(u.Failover())
	return c, c, fmt.Sprintf("redis sentinel %s master %s db %d%s", strings.Join(cfg.SentinelAddrs, ","), cfg.MasterName, cfg.DB, suffix), nil
}

// withTLSFiles applies cfg's TLS settings to tlsConfig (nil: no TLS,
// which Validate made sure none of them needs): the authorities to trust,
// the client certificate and the host name check.
func withTLSFiles(tlsConfig *tls.Config, cfg Config) error {
	if tlsConfig == nil {
		return nil
	}
	readFile := cfg.ReadFile
	if readFile == nil {
		readFile = os.ReadFile
	}
	if err := withCAFile(tlsConfig, cfg.TLSCAFile, readFile); err != nil {
		return err
	}
	if err := withClientCert(tlsConfig, cfg.TLSCertFile, cfg.TLSKeyFile, readFile); err != nil {
		return err
	}
	if cfg.TLSSkipHostnameVerification {
		tlsverify.ChainOnly(tlsConfig, "redis")
	}
	return nil
}

// withCAFile makes tlsConfig trust the certificate authorities in the PEM
// file path, read with readFile, instead of the system's. An empty path
// changes nothing.
func withCAFile(tlsConfig *tls.Config, path string, readFile func(string) ([]byte, error)) error {
	if path == "" {
		return nil
	}
	pem, err := readFile(path)
	if err != nil {
		return fmt.Errorf("redis tls ca file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("redis tls ca file %s: %w: no PEM certificate in it", path, node.ErrInvalidConfig)
	}
	tlsConfig.RootCAs = pool
	return nil
}

// withClientCert makes tlsConfig present the certificate in certFile with
// the key in keyFile, both PEM, read with readFile. Empty paths change
// nothing (Validate made sure they come together).
func withClientCert(tlsConfig *tls.Config, certFile, keyFile string, readFile func(string) ([]byte, error)) error {
	if certFile == "" {
		return nil
	}
	cert, err := readFile(certFile)
	if err != nil {
		return fmt.Errorf("redis tls cert file: %w", err)
	}
	key, err := readFile(keyFile)
	if err != nil {
		return fmt.Errorf("redis tls key file: %w", err)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return fmt.Errorf("redis tls cert file %s with key file %s: %w: %v (want the PEM certificate and the PEM private key that goes with it)", certFile, keyFile, node.ErrInvalidConfig, err)
	}
	tlsConfig.Certificates = []tls.Certificate{pair}
	return nil
}
