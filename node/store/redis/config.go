package redis

import (
	"cmp"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/quotad/quotad/node"
	goredis "github.com/redis/go-redis/v9"
)

// This file is the Redis store's configuration: Config, its defaults and
// its validation.

// Config says how to reach the authoritative Redis: a single server
// (URL), a Redis Cluster (ClusterAddrs) or a master watched by Sentinel
// (SentinelAddrs and MasterName). Exactly one of the three is set. Commands
// go to primaries only: a replica's counters may lag, and a limiter that
// reads lagging counters over-admits.
type Config struct {
	// URL is a single server: redis://[user:password@]host:port/db, or
	// rediss:// for TLS.
	URL string
	// ClusterAddrs are seed addresses (host:port) of a Redis Cluster; the
	// client discovers the other nodes and follows slot moves.
	ClusterAddrs []string
	// SentinelAddrs are Sentinel addresses (host:port); MasterName is the
	// master they watch. The client follows failovers.
	SentinelAddrs []string
	MasterName    string
	// Username and Password authenticate to Cluster and Sentinel-managed
	// servers (an ACL user, or only a password for requirepass). A URL
	// carries its own.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// themselves, when they require it.
	SentinelUsername, SentinelPassword string
	// DB is the database number behind Sentinel. Cluster has only db 0; a
	// URL names its own.
	DB int
	// TLS connects to Cluster and Sentinel-managed servers with TLS; a
	// rediss:// URL does it for a single server.
	TLS bool
	// TLSCAFile is a PEM file of the certificate authorities to trust
	// instead of the system's, for any TLS connection.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a client certificate (PEM, leaf
	// first) and its private key (PEM), presented to a Redis that asks
	// for one (redis-server's tls-auth-clients). Both or neither, and
	// only with TLS. Read once, when the clients are built.
	TLSCertFile, TLSKeyFile string
	// TLSSkipHostnameVerification still verifies the server's certificate
	// chain against the trusted authorities (TLSCAFile, else the
	// system's) but not that it names the host dialed: for a Redis
	// reached by an address its certificate does not carry. Only with
	// TLS.
	TLSSkipHostnameVerification bool
	// ReadFile reads TLSCAFile, TLSCertFile and TLSKeyFile. nil means
	// os.ReadFile, which waits for a writer when the path is a named pipe;
	// quotad passes the reader it reads every file with, which refuses
	// one.
	ReadFile func(path string) ([]byte, error)
	// Timeout bounds each store call as its caller sees it: waiting for a
	// pipeliner plus the round trip of its batch. A call that takes longer
	// fails: if Redis left a command unanswered for half of it, Redis is
	// late, and the policy's failure mode decides; else Redis was
	// answering and the node was late, and the call fails with
	// node.ErrOverloaded (liveness.go). Default 50ms.
	Timeout time.Duration
	// ConnectTimeout bounds what is not one call: opening a connection
	// (dial, TLS, HELLO with AUTH — a few round trips, which a Redis some
	// way off cannot fit into Timeout) and a circuit-breaker probe. A
	// round trip its callers gave up on keeps its connection for up to
	// ConnectTimeout + Timeout, so a late reply does not cost a new
	// connection. Default 1s.
	ConnectTimeout time.Duration
	// BatchWindow is the longest a script call waits for others to share
	// its round trip and batch script call (see pipeline.go), and only
	// while calls come faster than one per window; a call on a quiet node
	// goes at once. At most a twentieth of Timeout (a call may wait for
	// company only a small share of its time). 0, the
	// default, never waits: calls then share a round trip only when they
	// queue while round trips are in flight. Waiting trades a closed
	// loop's checks/s for fewer round trips, which paid off only in some
	// measurements (README, "Waiting for company"), so it is opt-in.
	BatchWindow time.Duration
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	modes := 0
	for _, set := range []bool{c.URL != "", len(c.ClusterAddrs) > 0, len(c.SentinelAddrs) > 0} {
		if set {
			modes++
		}
	}
	switch {
	case modes == 0:
		return fmt.Errorf("redis: %w: set a URL, cluster addresses or sentinel addresses", node.ErrInvalidConfig)
	case modes > 1:
		return fmt.Errorf("redis: %w: set only one of a URL, cluster addresses and sentinel addresses", node.ErrInvalidConfig)
	}
	if c.URL != "" {
		if _, err := goredis.ParseURL(c.URL); err != nil {
			// The parsers quote the URL, password and all.
			return fmt.Errorf("redis url: %w: %s (want redis://[user:password@]host:port/db or rediss://...)", node.ErrInvalidConfig, redactIn(err.Error(), c.URL))
		}
	}
	for field, addrs := range map[string][]string{"redis cluster": c.ClusterAddrs, "redis sentinel": c.SentinelAddrs} {
		for _, a := range addrs {
			if strings.ContainsAny(a, "@/") {
				return fmt.Errorf("%s address %q: %w: want host:port, without a scheme or credentials (give those with the username and password settings)", field, Redact(a), node.ErrInvalidConfig)
			}
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return fmt.Errorf("%s address %q: %w: want host:port", field, Redact(a), node.ErrInvalidConfig)
			}
		}
	}
	if len(c.SentinelAddrs) > 0 && c.MasterName == "" {
		return fmt.Errorf("redis master name: %w: sentinel addresses need the name of the master they watch", node.ErrInvalidConfig)
	}
	if (c.SentinelUsername != "" || c.SentinelPassword != "") && len(c.SentinelAddrs) == 0 {
		return fmt.Errorf("redis sentinel credentials: %w: only meaningful with sentinel addresses", node.ErrInvalidConfig)
	}
	if c.MasterName != "" && len(c.SentinelAddrs) == 0 {
		return fmt.Errorf("redis master name: %w: only meaningful with sentinel addresses", node.ErrInvalidConfig)
	}
	if c.DB != 0 && len(c.SentinelAddrs) == 0 {
		return fmt.Errorf("redis db: %w: only meaningful with sentinel (a URL names its own; Cluster has only db 0)", node.ErrInvalidConfig)
	}
	if c.DB < 0 {
		return fmt.Errorf("redis db: %w: %d must not be negative", node.ErrInvalidConfig, c.DB)
	}
	if c.URL != "" && (c.Username != "" || c.Password != "" || c.TLS) {
		return fmt.Errorf("redis: %w: a URL carries its own user, password and TLS (rediss://)", node.ErrInvalidConfig)
	}
	if c.TLSCAFile != "" && !c.TLS && !strings.HasPrefix(c.URL, "rediss://") {
		return fmt.Errorf("redis tls ca file: %w: %s given but the connection does not use TLS (rediss:// or TLS on)", node.ErrInvalidConfig, c.TLSCAFile)
	}
	tls := c.TLS || strings.HasPrefix(c.URL, "rediss://")
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fmt.Errorf("redis tls cert file: %w: a client certificate and its key go together (cert %q, key %q): set both, or neither", node.ErrInvalidConfig, c.TLSCertFile, c.TLSKeyFile)
	}
	if c.TLSCertFile != "" && !tls {
		return fmt.Errorf("redis tls cert file: %w: %s given but the connection does not use TLS (rediss:// or TLS on)", node.ErrInvalidConfig, c.TLSCertFile)
	}
	if c.TLSSkipHostnameVerification && !tls {
		return fmt.Errorf("redis tls skip hostname verification: %w: on but the connection does not use TLS (rediss:// or TLS on)", node.ErrInvalidConfig)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("redis timeout: %w: %s must not be negative (0 means the default)", node.ErrInvalidConfig, c.Timeout)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("redis connect timeout: %w: %s must not be negative (0 means the default)", node.ErrInvalidConfig, c.ConnectTimeout)
	}
	if c.BatchWindow < 0 {
		return fmt.Errorf("redis batch window: %w: %s must not be negative (0 never waits)", node.ErrInvalidConfig, c.BatchWindow)
	}
	if timeout := cmp.Or(c.Timeout, DefaultTimeout); c.BatchWindow > timeout/maxWindowShare {
		return fmt.Errorf("redis batch window: %w: %s exceeds a twentieth of the redis timeout %s (%s)", node.ErrInvalidConfig, c.BatchWindow, timeout, timeout/maxWindowShare)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	return c
}

// netTimeout is how long a round trip may take at the network level before
// its connection is given up: long enough to open a connection first, so
// neither a new connection nor a late reply is judged by one call's
// deadline.
func (c Config) netTimeout() time.Duration { return c.ConnectTimeout + c.Timeout }
