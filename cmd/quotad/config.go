package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memcache"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/rpc/rlqs"
)

// config is everything quotad can be told, from defaults, then the config
// file, then QUOTAD_* environment variables, then flags.
type config struct {
	// Listen is the address the API listens on: host:port, or
	// unix:PATH for a Unix socket (listen.go). Default ":8080".
	Listen string
	// Redis makes Redis the authoritative store (a URL, Cluster seeds or
	// Sentinel); none of them set means the embedded memory store.
	// Redis.Timeout defaults to redis.DefaultTimeout and
	// Redis.ConnectTimeout to redis.DefaultConnectTimeout.
	Redis redis.Config
	// Memcache makes memcached the authoritative store instead (its
	// servers set), for fixed windows only.
	Memcache memcache.Config
	// MemcacheTLS makes the connections to memcached TLS; the zero value
	// is cleartext.
	MemcacheTLS memcacheTLSConfig
	// Breaker configures the circuit breaker in front of Redis; the zero
	// value takes node's defaults (5 failures, probe every 250ms).
	Breaker node.BreakerConfig
	// KeyPrefix starts every Redis key. Default "quotad".
	KeyPrefix string
	// InlineLimits lets requests carry their own limit. Default true.
	InlineLimits bool
	// ClientLeases lets clients take leases (AcquireLease). Default true.
	ClientLeases bool
	// DefaultOnStoreError is the failure mode of policies that set none.
	// Default open.
	DefaultOnStoreError node.FailureMode
	// Policies are the configured policies.
	Policies []node.Policy
	// ShutdownTimeout bounds the graceful shutdown. Default 10s.
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LogFormat is text (logfmt) or json. Default text.
	LogFormat string
	// Lease sizes leases; the zero value takes node's defaults (horizon
	// 200ms, hold 500ms, max fraction 0.05).
	Lease node.LeaseConfig
	// DeniedCache sizes the hot denied-key cache; the zero value means
	// 100,000 entries.
	DeniedCache cache.DeniedConfig
	// MaxBatch bounds the checks in one CheckBatch; 0 means rpc's
	// default, 1000 (also the most allowed).
	MaxBatch int
	// MaxRequestBytes bounds one CheckBatch or ShouldRateLimit request
	// message (other calls': at most rpc.MaxCallRequestBytes); 0 means
	// rpc's default, 2 MiB.
	MaxRequestBytes int
	// MaxInlinePeriod bounds how long an inline limit's state may live;
	// 0 means rpc's default, 24h.
	MaxInlinePeriod time.Duration
	// MemoryMaxKeys bounds the embedded memory store's states; 0 means
	// node's default, 250,000.
	MemoryMaxKeys int
	// Server bounds the API's connections: timeouts and the connection
	// cap; zero fields take rpc's defaults (read timeout 30s, idle timeout
	// 2m, 10,000 connections).
	Server rpc.ServerConfig
	// Envoy configures Envoy's rate limit service; the zero value leaves it
	// unserved.
	Envoy envoy.Config
	// EnvoyDir is a directory of envoyproxy/ratelimit config files whose
	// domains Envoy's rate limit service serves beside Envoy's, reloaded
	// when they change; empty means none.
	EnvoyDir string
	// EnvoyHeaders adds envoyproxy/ratelimit's rate limit response
	// headers to Envoy's answers (envoy.Config.ResponseHeaders).
	EnvoyHeaders envoyHeadersConfig
	// RLQS configures Envoy's rate limit quota service; without domains
	// it is unserved.
	RLQS rlqs.Config
	// EnvoyXDS takes envoyproxy/ratelimit's rules from an xDS management
	// server instead of EnvoyDir; its zero value takes none.
	EnvoyXDS envoyXDSConfig
	// Telemetry says where traces go and whether /metrics is served.
	Telemetry telemetryConfig
	// Cluster makes the node a cluster member; the zero value runs
	// standalone.
	Cluster clusterConfig
	// Console is the web console at GET /. Default on, keys hashed.
	Console consoleConfig
	// TLS makes the API port serve TLS; the zero value serves cleartext.
	TLS tlsConfig
	// AdminTokenFile holds the bearer token admin calls (Reset) require;
	// empty leaves them open.
	AdminTokenFile string
	// AllowedHosts are more Host names the console, /status, /cluster and
	// (without an admin token) admin calls answer, besides localhost and
	// the IP addresses the listen address allows; "*" alone allows every
	// Host. Default none.
	AllowedHosts []string
	// PprofAddr is where Go's profiler is served (host:port); empty, the
	// default, serves none.
	PprofAddr string
	// GRPCTransport is grpc-go (the default) or connect: what serves gRPC
	// on the API's port.
	GRPCTransport string
	// File is the config file the settings were read from; the zero value
	// when there is none.
	File configFile
}

// configFile names a config file and what was read from it.
type configFile struct {
	// Path is the file as given to --config.
	Path string
	// SHA256 is the hex SHA-256 of the bytes read, which sha256sum prints
	// for the same file.
	SHA256 string
}

// nodeConfig and rpcConfig hand each package its part.
func (c config) nodeConfig() node.Config {
	return node.Config{
		KeyPrefix: c.KeyPrefix, Policies: c.Policies, DefaultFailureMode: c.DefaultOnStoreError,
		Lease: c.Lease, DeniedCache: c.DeniedCache, Breaker: c.Breaker,
	}
}

// usesRedis reports whether Redis, not the memory store, is the authority.
func (c config) usesRedis() bool {
	return c.Redis.URL != "" || len(c.Redis.ClusterAddrs) > 0 || len(c.Redis.SentinelAddrs) > 0
}

// usesMemcache reports whether memcached, not the memory store, is the
// authority.
func (c config) usesMemcache() bool { return len(c.Memcache.Addrs) > 0 || c.Memcache.SRV != "" }

// usesSharedStore reports whether the authority is a store every node
// may share: Redis or memcached.
func (c config) usesSharedStore() bool { return c.usesRedis() || c.usesMemcache() }

func (c config) rpcConfig() rpc.Config {
	return rpc.Config{DisableInlineLimits: !c.InlineLimits, DisableClientLeases: !c.ClientLeases, MaxBatch: c.MaxBatch, MaxRequestBytes: c.MaxRequestBytes, MaxInlinePeriod: c.MaxInlinePeriod,
		DisableConsole: !c.Console.Enabled, ShowKeys: c.Console.ShowKeys, Listen: c.Listen, AllowedHosts: c.AllowedHosts}
}

// validate checks what no package checks for itself.
func (c config) validate() error {
	if c.Listen == "" {
		return errors.New("listen: must not be empty")
	}
	if path, unix := strings.CutPrefix(c.Listen, unixListenPrefix); unix {
		if path == "" {
			return fmt.Errorf("listen: %q: want the socket's path after unix:, e.g. unix:/run/quotad.sock", c.Listen)
		}
	} else if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		if _, numeric := strconv.Atoi(c.Listen); numeric == nil {
			return fmt.Errorf("listen: %q is a port alone; write :%s (every interface) or 127.0.0.1:%s (this machine only)", c.Listen, c.Listen, c.Listen)
		}
		return fmt.Errorf("listen: %q: want host:port, e.g. :8080 or 127.0.0.1:8080, or unix:/path for a Unix socket", c.Listen)
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("listen: %q: the port must be a number from 0 to 65535", c.Listen)
	}
	if c.Redis.Timeout <= 0 {
		return fmt.Errorf("redis timeout: %s must be > 0", c.Redis.Timeout)
	}
	if c.Redis.ConnectTimeout <= 0 {
		return fmt.Errorf("redis connect timeout: %s must be > 0", c.Redis.ConnectTimeout)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("shutdown timeout: %s must be > 0", c.ShutdownTimeout)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("log format: %q: want text or json", c.LogFormat)
	}
	if err := c.Telemetry.validate(); err != nil {
		return err
	}
	if c.RLQS.Serves() && c.GRPCTransport == grpcTransportConnect {
		return errors.New("rlqs: Envoy's rate limit quota service streams over the gRPC front end, which --grpc-transport=connect turns off; remove --grpc-transport=connect or the rlqs section's domains")
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	if err := validateAdminToken(c.AdminTokenFile); err != nil {
		return err
	}
	if err := validatePprofAddr(c.PprofAddr); err != nil {
		return err
	}
	if err := validateGRPCTransport(c.GRPCTransport); err != nil {
		return err
	}
	if err := c.MemcacheTLS.validate(c.usesMemcache()); err != nil {
		return err
	}
	if c.Memcache.SRVRefresh != 0 && c.Memcache.SRV == "" {
		return errors.New("memcache: --memcache-srv-refresh needs --memcache-srv, the record to look up again")
	}
	if c.usesMemcache() {
		if c.usesRedis() {
			return errors.New("memcache: --memcache and Redis (--redis, --redis-cluster or --redis-sentinel) are both set; choose one store")
		}
		if err := c.Memcache.Validate(); err != nil {
			return err
		}
		if c.Memcache.Timeout <= 0 {
			return fmt.Errorf("memcache timeout: %s must be > 0, e.g. 100ms", c.Memcache.Timeout)
		}
		if c.Memcache.MaxIdleConns <= 0 {
			return fmt.Errorf("memcache max idle conns: %d must be at least 1", c.Memcache.MaxIdleConns)
		}
		if err := c.memcachePolicies(); err != nil {
			return err
		}
	}
	if c.usesRedis() {
		if err := c.Redis.Validate(); err != nil {
			return err
		}
	} else if r := c.Redis; r.MasterName != "" || r.Username != "" || r.Password != "" || r.SentinelUsername != "" || r.SentinelPassword != "" || r.TLS || r.TLSCAFile != "" || r.TLSCertFile != "" || r.TLSKeyFile != "" || r.TLSSkipHostnameVerification || r.DB != 0 {
		return errors.New("redis: credentials, TLS, db or a master name are set but no Redis is (set --redis, --redis-cluster or --redis-sentinel)")
	}
	if err := c.rpcConfig().Validate(); err != nil {
		return err
	}
	if err := c.EnvoyHeaders.validate(); err != nil {
		return err
	}
	if err := c.envoyConfig().Validate(c.Policies); err != nil {
		return err
	}
	if err := c.EnvoyXDS.validate(c.EnvoyDir); err != nil {
		return err
	}
	if err := c.Server.Validate(); err != nil {
		return err
	}
	if err := (memory.Config{MaxKeys: c.MemoryMaxKeys}).Validate(); err != nil {
		return err
	}
	if err := c.Cluster.validate(c.usesSharedStore()); err != nil {
		return err
	}
	return c.nodeConfig().Validate()
}
