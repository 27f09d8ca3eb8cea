package main

import (
	"strings"
	"time"

	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
	"github.com/quotad/quotad/node/store/memcache"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/rpc/rlqs"
)

// This file is the settings table: every setting quotad has, declared
// once (see settings for how to add one).

// setting is one of quotad's settings, declared once: the table in
// settings drives the flags, the QUOTAD_* environment variables, the config
// file's keys, the defaults, `quotad --help` and the effective settings
// (--print-settings); a test holds the README's configuration tables to it.
type setting struct {
	// flag is the flag's name, without "--". The environment variable is
	// QUOTAD_ and the name upper-cased, '-' as '_' (env).
	flag string
	// file is the setting's key in the config file, dotted through its
	// sections: "redis.timeout" is timeout: under redis:.
	file string
	// arg names the flag's value in --help ("duration", "host:port");
	// empty for a boolean, which takes none.
	arg string
	// def is the value config starts from, as a flag would give it;
	// defaultConfig applies it. Empty leaves the field's zero value.
	def string
	// zeroMeans is, for a setting without def, the default that the
	// package reading the field takes for its zero value (so 0 written
	// out means it too), as --help shows it.
	zeroMeans string
	// unset says what leaving a setting without def unset means ("none
	// (memory store)"), for --help; empty shows the zero value, or "none".
	unset string
	// help says what the setting does: one or two clauses, without its
	// default, environment variable or file key, which --help adds.
	help string
	// secret keeps the value out of --print-settings.
	secret bool
	// v is where the value lives in config, and how flags, the
	// environment and the file set it.
	v value
}

// env is the setting's environment variable: QUOTAD_REDIS_TIMEOUT for
// redis-timeout.
func (s setting) env() string {
	return "QUOTAD_" + strings.ToUpper(strings.ReplaceAll(s.flag, "-", "_"))
}

// section is the config file's top-level key the setting is under:
// redis for redis.timeout, max_batch for max_batch.
func (s setting) section() string {
	section, _, _ := strings.Cut(s.file, ".")
	return section
}

// shownDefault is the default as --help and the README show it.
func (s setting) shownDefault() string {
	switch {
	case s.def != "":
		return s.def
	case s.zeroMeans != "":
		return s.zeroMeans
	case s.unset != "":
		return s.unset
	}
	var zero config
	if z := s.v.format(&zero); z != "" {
		return z
	}
	return "none"
}

// settings is every setting of quotad, in the order --help lists them.
//
// To add one: give config (or the package config it embeds) a field, with
// its unit and default in the field's comment, and add one entry here: the
// flag's name (the environment variable follows from it), the file key,
// the kind of value (text, boolean, whole, whole64, duration, number,
// optionalNumber, addresses, failureMode, or a new kind in
// setting_kinds.go) pointing at the field, def or zeroMeans or unset, and
// the help text. Flags, environment, file, defaults, --help and
// --print-settings follow; then add the setting's row to the README's
// configuration table (TestREADMEConfigTableMatchesHelp fails until it is
// there), and validate the value where config.validate or the package's
// Validate does. A setting whose change applies without a restart also
// needs a line in reloadable (reload.go).
func settings() []setting {
	return []setting{
		{flag: "listen", file: "listen", arg: "host:port", def: ":8080", help: "address the API listens on: host:port, or unix:PATH for a Unix socket",
			v: text(func(c *config) *string { return &c.Listen })},
		{flag: "redis", file: "redis.url", arg: "url", unset: "none (memory store)", help: "Redis URL for the authoritative store: redis://[user:password@]host:port/db or rediss:// for TLS; no Redis at all uses the embedded memory store (single node); errors and --print-settings show its password as xxxxx",
			v: text(func(c *config) *string { return &c.Redis.URL })},
		{flag: "redis-cluster", file: "redis.cluster", arg: "host:port,host:port", help: "Redis Cluster seed addresses instead of --redis",
			v: addresses(func(c *config) *[]string { return &c.Redis.ClusterAddrs })},
		{flag: "redis-sentinel", file: "redis.sentinel", arg: "host:port,host:port", help: "Sentinel addresses instead of --redis; needs --redis-master",
			v: addresses(func(c *config) *[]string { return &c.Redis.SentinelAddrs })},
		{flag: "redis-master", file: "redis.master", arg: "name", help: "name of the master the sentinels watch",
			v: text(func(c *config) *string { return &c.Redis.MasterName })},
		{flag: "redis-username", file: "redis.username", arg: "user", help: "ACL user for --redis-cluster and --redis-sentinel servers (a URL carries its own)",
			v: text(func(c *config) *string { return &c.Redis.Username })},
		{flag: "redis-password", file: "redis.password", arg: "password", secret: true, help: "password for --redis-cluster and --redis-sentinel servers; prefer the environment variable",
			v: text(func(c *config) *string { return &c.Redis.Password })},
		{flag: "redis-sentinel-username", file: "redis.sentinel_username", arg: "user", help: "ACL user for the sentinels themselves",
			v: text(func(c *config) *string { return &c.Redis.SentinelUsername })},
		{flag: "redis-sentinel-password", file: "redis.sentinel_password", arg: "password", secret: true, help: "password for the sentinels themselves",
			v: text(func(c *config) *string { return &c.Redis.SentinelPassword })},
		{flag: "redis-db", file: "redis.db", arg: "number", help: "database behind Sentinel (a URL names its own; Cluster has only 0)",
			v: whole(func(c *config) *int { return &c.Redis.DB })},
		{flag: "redis-tls", file: "redis.tls", help: "use TLS with --redis-cluster and --redis-sentinel (rediss:// does it for --redis)",
			v: boolean(func(c *config) *bool { return &c.Redis.TLS })},
		{flag: "redis-tls-ca", file: "redis.tls_ca_file", arg: "file", unset: "system roots", help: "PEM file of the certificate authorities to trust for Redis TLS instead of the system's",
			v: text(func(c *config) *string { return &c.Redis.TLSCAFile })},
		{flag: "redis-tls-cert-file", file: "redis.tls_cert_file", arg: "file", unset: "none", help: "client certificate (PEM) to present to Redis over TLS, with --redis-tls-key-file, for a Redis that requires one (tls-auth-clients)",
			v: text(func(c *config) *string { return &c.Redis.TLSCertFile })},
		{flag: "redis-tls-key-file", file: "redis.tls_key_file", arg: "file", unset: "none", help: "private key (PEM) of --redis-tls-cert-file",
			v: text(func(c *config) *string { return &c.Redis.TLSKeyFile })},
		{flag: "redis-tls-skip-hostname-verification", file: "redis.tls_skip_hostname_verification", help: "verify Redis's certificate chain against the trusted CAs but not that it names the host dialed",
			v: boolean(func(c *config) *bool { return &c.Redis.TLSSkipHostnameVerification })},
		{flag: "redis-timeout", file: "redis.timeout", arg: "duration", def: show(redis.DefaultTimeout), help: "deadline of each Redis call, queueing included; past it the policy's failure mode decides if Redis was late, and the check is shed (Unavailable) if quotad was",
			v: duration(func(c *config) *time.Duration { return &c.Redis.Timeout })},
		{flag: "redis-connect-timeout", file: "redis.connect_timeout", arg: "duration", def: show(redis.DefaultConnectTimeout), help: "deadline of opening a Redis connection (dial, TLS, HELLO) and of a circuit-breaker probe, apart from --redis-timeout",
			v: duration(func(c *config) *time.Duration { return &c.Redis.ConnectTimeout })},
		{flag: "redis-batch-window", file: "redis.batch_window", arg: "duration", def: "0s", help: "longest a Redis call waits for others to share its round trip, only while calls come faster than one per window; 0 never waits",
			v: duration(func(c *config) *time.Duration { return &c.Redis.BatchWindow })},
		{flag: "memcache", file: "memcache.servers", arg: "host:port,host:port", unset: "none", help: "memcached servers for the authoritative store instead of Redis, as envoyproxy/ratelimit's BACKEND_TYPE=memcache: fixed windows only, every node listing the same servers in the same order",
			v: addresses(func(c *config) *[]string { return &c.Memcache.Addrs })},
		{flag: "memcache-srv", file: "memcache.srv", arg: "_service._proto.name", unset: "none", help: "DNS SRV record that lists the memcached servers, instead of --memcache; looked up at start (quotad stops if it cannot), the servers sorted",
			v: text(func(c *config) *string { return &c.Memcache.SRV })},
		{flag: "memcache-srv-refresh", file: "memcache.srv_refresh", arg: "duration", def: "0s", help: "how often --memcache-srv is looked up again, a changed list replacing the servers; 0 looks it up once",
			v: duration(func(c *config) *time.Duration { return &c.Memcache.SRVRefresh })},
		{flag: "memcache-timeout", file: "memcache.timeout", arg: "duration", def: show(memcache.DefaultTimeout), help: "deadline of each memcached call, its connection's dial included; past it the policy's failure mode decides",
			v: duration(func(c *config) *time.Duration { return &c.Memcache.Timeout })},
		{flag: "memcache-max-idle-conns", file: "memcache.max_idle_conns", arg: "count", def: "2", help: "idle connections kept per memcached server for the next calls (envoyproxy/ratelimit's MEMCACHE_MAX_IDLE_CONNS)",
			v: whole(func(c *config) *int { return &c.Memcache.MaxIdleConns })},
		{flag: "memcache-tls", file: "memcache.tls", help: "speak TLS to memcached",
			v: boolean(func(c *config) *bool { return &c.MemcacheTLS.Enabled })},
		{flag: "memcache-tls-ca", file: "memcache.tls_ca_file", arg: "file", unset: "system roots", help: "PEM file of the certificate authorities to trust for memcached's TLS instead of the system's",
			v: text(func(c *config) *string { return &c.MemcacheTLS.CAFile })},
		{flag: "memcache-tls-cert-file", file: "memcache.tls_cert_file", arg: "file", unset: "none", help: "client certificate (PEM) to present to memcached over TLS, with --memcache-tls-key-file",
			v: text(func(c *config) *string { return &c.MemcacheTLS.CertFile })},
		{flag: "memcache-tls-key-file", file: "memcache.tls_key_file", arg: "file", unset: "none", help: "private key (PEM) of --memcache-tls-cert-file",
			v: text(func(c *config) *string { return &c.MemcacheTLS.KeyFile })},
		{flag: "memcache-tls-skip-hostname-verification", file: "memcache.tls_skip_hostname_verification", help: "verify memcached's certificate chain against the trusted CAs but not that it names the host dialed",
			v: boolean(func(c *config) *bool { return &c.MemcacheTLS.SkipHostnameVerification })},
		{flag: "breaker-failures", file: "breaker.failures", arg: "count", zeroMeans: "5", help: "Redis calls failing in a row that open the circuit breaker; while open, checks take their failure mode at once",
			v: whole(func(c *config) *int { return &c.Breaker.Failures })},
		{flag: "breaker-probe-every", file: "breaker.probe_every", arg: "duration", zeroMeans: "250ms", help: "how often an open breaker pings Redis; the first answer closes it",
			v: duration(func(c *config) *time.Duration { return &c.Breaker.ProbeEvery })},
		{flag: "key-prefix", file: "key_prefix", arg: "prefix", def: "quotad", help: "prefix of every Redis key, {prefix:policy:key}",
			v: text(func(c *config) *string { return &c.KeyPrefix })},
		{flag: "inline-limits", file: "inline_limits", def: "true", help: "accept limits sent inline in requests (gubernator-style)",
			v: boolean(func(c *config) *bool { return &c.InlineLimits })},
		{flag: "client-leases", file: "client_leases", def: "true", help: "grant leases to clients in local mode (AcquireLease), to spend in their own processes; false answers AcquireLease as Check, with no units",
			v: boolean(func(c *config) *bool { return &c.ClientLeases })},
		{flag: "default-on-store-error", file: "default_on_store_error", arg: "mode", def: node.FailOpen.String(), help: "failure mode of policies that set none: open or closed",
			v: failureMode(func(c *config) *node.FailureMode { return &c.DefaultOnStoreError })},
		{flag: "lease-horizon", file: "lease.horizon", arg: "duration", zeroMeans: "200ms", help: "a lease covers about this much of a key's recent demand on this node",
			v: duration(func(c *config) *time.Duration { return &c.Lease.Horizon })},
		{flag: "lease-hold", file: "lease.hold", arg: "duration", zeroMeans: "500ms", help: "longest a lease is spent before its unused units go back to Redis (at least the horizon)",
			v: duration(func(c *config) *time.Duration { return &c.Lease.Hold })},
		{flag: "lease-max-fraction", file: "lease.max_fraction", arg: "fraction", zeroMeans: "0.05", help: "all nodes' leases on one key together hold at most this fraction of its capacity (its burst where it has one, else its limit), in (0, 1]",
			v: number(func(c *config) *float64 { return &c.Lease.MaxFraction }, "0.05")},
		{flag: "lease-max-keys", file: "lease.max_keys", arg: "count", zeroMeans: show(node.DefaultLeaseMaxKeys), help: "most keys a node tracks for leasing; at the bound, other keys go to Redis one check at a time",
			v: whole(func(c *config) *int { return &c.Lease.MaxKeys })},
		{flag: "denied-cache-entries", file: "denied_cache.max_entries", arg: "entries", zeroMeans: show(cache.DefaultDeniedEntries), help: "size of the hot denied-key cache in entries (the default only without --denied-cache-bytes)",
			v: whole64(func(c *config) *int64 { return &c.DeniedCache.MaxEntries })},
		{flag: "denied-cache-bytes", file: "denied_cache.max_bytes", arg: "bytes", unset: "none", help: "size of the hot denied-key cache in bytes instead of entries",
			v: whole64(func(c *config) *int64 { return &c.DeniedCache.MaxBytes })},
		{flag: "max-batch", file: "max_batch", arg: "count", zeroMeans: show(rpc.MaxBatchLimit), help: "most checks one CheckBatch may carry, 1 to 1000",
			v: whole(func(c *config) *int { return &c.MaxBatch })},
		{flag: "max-request-bytes", file: "max_request_bytes", arg: "bytes", zeroMeans: show(rpc.DefaultMaxRequestBytes), help: "largest CheckBatch or Envoy ShouldRateLimit message accepted, after decompression (other calls' are bounded at 64 KiB, or this if smaller); larger ones fail with ResourceExhausted",
			v: whole(func(c *config) *int { return &c.MaxRequestBytes })},
		{flag: "max-inline-period", file: "max_inline_period", arg: "duration", zeroMeans: show(rpc.DefaultMaxInlinePeriod), help: "longest an inline limit's state may live: its period, or for buckets and gcra the time to restore a full burst; longer is InvalidArgument; 8760h allows every period",
			v: duration(func(c *config) *time.Duration { return &c.MaxInlinePeriod })},
		{flag: "memory-max-keys", file: "memory_max_keys", arg: "count", zeroMeans: show(memory.DefaultMaxKeys), help: "most keys the embedded memory store holds; at the bound, checks of new keys fail with ResourceExhausted",
			v: whole(func(c *config) *int { return &c.MemoryMaxKeys })},
		{flag: "read-header-timeout", file: "read_header_timeout", arg: "duration", zeroMeans: show(rpc.DefaultReadHeaderTimeout), help: "how long a new connection may take for its TLS handshake and its first request's headers together (HTTP/2 included), and an HTTP/1.1 request for its headers; past it the connection is closed",
			v: duration(func(c *config) *time.Duration { return &c.Server.ReadHeaderTimeout })},
		{flag: "read-timeout", file: "read_timeout", arg: "duration", zeroMeans: show(rpc.DefaultReadTimeout), help: "how long a request body may take to arrive, except gRPC on grpc-go",
			v: duration(func(c *config) *time.Duration { return &c.Server.ReadTimeout })},
		{flag: "idle-timeout", file: "idle_timeout", arg: "duration", zeroMeans: show(rpc.DefaultIdleTimeout), help: "a connection with no request in flight for this long is closed",
			v: duration(func(c *config) *time.Duration { return &c.Server.IdleTimeout })},
		{flag: "max-connections", file: "max_connections", arg: "count", zeroMeans: show(rpc.DefaultMaxConnections), help: "most API connections open at once; at the bound a new one replaces the longest idle, or is closed if none is idle",
			v: whole(func(c *config) *int { return &c.Server.MaxConnections })},
		{flag: "max-connection-age", file: "max_connection_age", arg: "duration", unset: "0s (never)", help: "a connection this old (±10%) is asked to go: a GOAWAY that lets its requests finish (HTTP/2, gRPC), Connection: close on its next response (HTTP/1.1); clients reconnect, and a load balancer spreads them",
			v: duration(func(c *config) *time.Duration { return &c.Server.MaxConnectionAge })},
		{flag: "max-connection-age-grace", file: "max_connection_age_grace", arg: "duration", unset: "0s (wait for its requests)", help: "how long past --max-connection-age a connection may stay for its requests in flight before it is closed",
			v: duration(func(c *config) *time.Duration { return &c.Server.MaxConnectionAgeGrace })},
		{flag: "shutdown-timeout", file: "shutdown_timeout", arg: "duration", def: "10s", help: "how long in-flight requests may take to finish on shutdown",
			v: duration(func(c *config) *time.Duration { return &c.ShutdownTimeout })},
		{flag: "log-level", file: "log_level", arg: "level", def: "info", help: "debug, info, warn or error",
			v: text(func(c *config) *string { return &c.LogLevel })},
		{flag: "log-format", file: "log_format", arg: "format", def: "text", help: "text (logfmt) or json, one object a line",
			v: text(func(c *config) *string { return &c.LogFormat })},

		{flag: "trace-exporter", file: "tracing.exporter", arg: "name", unset: "OTEL_TRACES_EXPORTER, else none", help: "where spans go: none, otlp-grpc, otlp-http or stdout; unset reads OTEL_TRACES_EXPORTER (otlp, console, none)",
			v: text(func(c *config) *string { return &c.Telemetry.TraceExporter })},
		{flag: "trace-endpoint", file: "tracing.endpoint", arg: "URL", unset: "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT", help: "OTLP collector for spans: a URL (http://collector:4317, http means no TLS) or host:port",
			v: text(func(c *config) *string { return &c.Telemetry.TraceEndpoint })},
		{flag: "trace-sample-ratio", file: "tracing.sample_ratio", arg: "fraction", unset: "OTEL_TRACES_SAMPLER, else all", help: "share of new traces recorded, 0 to 1 (requests carrying trace context follow their caller)",
			v: optionalNumber(func(c *config) **float64 { return &c.Telemetry.TraceSampleRatio }, "0.01")},
		{flag: "metrics", file: "metrics", def: "true", help: "serve Prometheus metrics at GET /metrics on the API port",
			v: boolean(func(c *config) *bool { return &c.Telemetry.Metrics })},
		{flag: "statsd-addr", file: "statsd.addr", arg: "host:port", unset: "none", help: "statsd server to send envoyproxy/ratelimit's statistics to (ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.total_hits and the rest), the counts of each flush interval",
			v: text(func(c *config) *string { return &c.Telemetry.Statsd.Addr })},
		{flag: "statsd-protocol", file: "statsd.protocol", arg: "name", def: statsdUDP, help: "udp (datagrams of at most 1432 bytes) or tcp",
			v: text(func(c *config) *string { return &c.Telemetry.Statsd.Protocol })},
		{flag: "statsd-flush-interval", file: "statsd.flush_interval", arg: "duration", def: "10s", help: "how often the counts are sent to statsd",
			v: duration(func(c *config) *time.Duration { return &c.Telemetry.Statsd.FlushInterval })},
		{flag: "statsd-tags", file: "statsd.tags", arg: "key:value,...", unset: "none", help: "tags of every statistic sent to statsd: in the name (.__key=value), or as DogStatsD tags with --statsd-dogstatsd",
			v: text(func(c *config) *string { return &c.Telemetry.Statsd.Tags })},
		{flag: "statsd-dogstatsd", file: "statsd.dogstatsd", help: "send --statsd-tags as DogStatsD tags (|#key:value)",
			v: boolean(func(c *config) *bool { return &c.Telemetry.Statsd.DogStatsD })},
		{flag: "statsd-mogrifiers", file: "statsd.mogrifiers", arg: "JSON", unset: "none", help: `rewrite DogStatsD names and add tags, as envoyproxy/ratelimit's mogrifiers: [{"pattern": "regexp", "name": "template", "tags": {"key": "template"}}], $1 and the like the pattern's groups, the first match applied; needs --statsd-dogstatsd`,
			v: text(func(c *config) *string { return &c.Telemetry.Statsd.Mogrifiers })},

		{flag: "cluster-addr", file: "cluster.addr", arg: "host:port", unset: "none (standalone)", help: "gossip address (UDP and TCP) that makes this node a cluster member; host an IP or empty for all interfaces; needs --redis",
			v: text(func(c *config) *string { return &c.Cluster.Addr })},
		{flag: "cluster-advertise", file: "cluster.advertise", arg: "host:port", unset: "bind address", help: "address the other nodes reach this one at, when it differs from --cluster-addr",
			v: text(func(c *config) *string { return &c.Cluster.Advertise })},
		{flag: "join", file: "cluster.join", arg: "host:port[,host:port...]", help: "cluster seeds to join; a DNS name stands for every address it resolves to (a Kubernetes headless service)",
			v: addresses(func(c *config) *[]string { return &c.Cluster.Join })},
		{flag: "node-name", file: "cluster.node_name", arg: "name", unset: "hostname:port", help: "this node's name in the cluster, unique",
			v: text(func(c *config) *string { return &c.Cluster.NodeName })},
		{flag: "cluster-key-file", file: "cluster.key_file", arg: "file", unset: "none: required unless --cluster-insecure", help: "file with the shared gossip key that encrypts and authenticates the cluster: base64 of 16, 24 or 32 bytes (openssl rand -base64 32), or the raw bytes; required with --cluster-addr unless --cluster-insecure",
			v: text(func(c *config) *string { return &c.Cluster.KeyFile })},
		{flag: "cluster-insecure", file: "cluster.insecure", help: "gossip without --cluster-key-file: unencrypted and unauthenticated, so anyone who reaches --cluster-addr can join, read and forge gossip (a forged denial still lasts no longer than its limit could justify); only for a network nobody else reaches",
			v: boolean(func(c *config) *bool { return &c.Cluster.Insecure })},
		{flag: "cluster-dead-after", file: "cluster.dead_after", arg: "duration", zeroMeans: show(cluster.DefaultDeadAfter), help: "a member that stops answering is dropped from the cluster after about this long",
			v: duration(func(c *config) *time.Duration { return &c.Cluster.DeadAfter })},
		{flag: "cluster-rejoin-interval", file: "cluster.rejoin_interval", arg: "duration", zeroMeans: show(cluster.DefaultRejoinInterval), help: "how often seeds and dead members are re-joined, which heals partitions",
			v: duration(func(c *config) *time.Duration { return &c.Cluster.RejoinInterval })},
		{flag: "cluster-api-port", file: "cluster.api_port", arg: "port", zeroMeans: "the --listen port", help: "port of the members' API, reached at the host of each member's gossip address, that GET /status?scope=cluster (the console's cluster view) asks for each member's figures",
			v: whole(func(c *config) *int { return &c.Cluster.APIPort })},

		{flag: "envoy-config-dir", file: "envoy.config_dir", arg: "directory", help: "directory of envoyproxy/ratelimit config files (*.yaml, *.yml; one domain each), served unchanged by Envoy's rate limit service and reloaded when they change",
			v: text(func(c *config) *string { return &c.EnvoyDir })},
		{flag: "envoy-xds-server", file: "envoy.xds_server", arg: "host:port", unset: "none", help: "xDS management server to take envoyproxy/ratelimit's rules from (RateLimitConfig resources, state of the world) instead of --envoy-config-dir; the last rules applied stay while it is away",
			v: text(func(c *config) *string { return &c.EnvoyXDS.Server })},
		{flag: "envoy-xds-node-id", file: "envoy.xds_node_id", arg: "id", unset: "default", help: "node id quotad names itself with to the xDS management server, which keeps rules per node id",
			v: text(func(c *config) *string { return &c.EnvoyXDS.NodeID })},
		{flag: "envoy-xds-node-metadata", file: "envoy.xds_node_metadata", arg: "key=value,...", unset: "none", help: "metadata of the node quotad names itself with to the xDS management server",
			v: text(func(c *config) *string { return &c.EnvoyXDS.NodeMetadata })},
		{flag: "envoy-xds-headers", file: "envoy.xds_headers", arg: "name=value,...", unset: "none", help: "headers sent with the stream to the xDS management server (e.g. a token)",
			v: text(func(c *config) *string { return &c.EnvoyXDS.Headers })},
		{flag: "envoy-xds-tls", file: "envoy.xds_tls", help: "dial the xDS management server over TLS",
			v: boolean(func(c *config) *bool { return &c.EnvoyXDS.TLS })},
		{flag: "envoy-xds-tls-ca-file", file: "envoy.xds_tls_ca_file", arg: "file", unset: "system roots", help: "PEM file of the certificate authorities to trust for the xDS management server",
			v: text(func(c *config) *string { return &c.EnvoyXDS.TLSCAFile })},
		{flag: "envoy-xds-tls-cert-file", file: "envoy.xds_tls_cert_file", arg: "file", unset: "none", help: "client certificate (PEM) to present to the xDS management server, with --envoy-xds-tls-key-file",
			v: text(func(c *config) *string { return &c.EnvoyXDS.TLSCertFile })},
		{flag: "envoy-xds-tls-key-file", file: "envoy.xds_tls_key_file", arg: "file", unset: "none", help: "private key (PEM) of --envoy-xds-tls-cert-file",
			v: text(func(c *config) *string { return &c.EnvoyXDS.TLSKeyFile })},
		{flag: "envoy-xds-tls-server-name", file: "envoy.xds_tls_server_name", arg: "name", unset: "the server's host", help: "name the xDS management server's certificate must carry",
			v: text(func(c *config) *string { return &c.EnvoyXDS.TLSServerName })},
		{flag: "envoy-xds-retry-interval", file: "envoy.xds_retry_interval", arg: "duration", zeroMeans: "3s", help: "wait before dialing the xDS management server again after its stream ended (with jitter of up to half of it)",
			v: duration(func(c *config) *time.Duration { return &c.EnvoyXDS.RetryInterval })},
		{flag: "rlqs-assignment-interval", file: "rlqs.assignment_interval", arg: "duration", zeroMeans: show(rlqs.DefaultAssignmentInterval), help: "length of a round of Envoy's rate limit quota service: every member divides each limit among the Envoys once a round, at its multiples since the Unix epoch; whole seconds",
			v: duration(func(c *config) *time.Duration { return &c.RLQS.AssignmentInterval })},
		{flag: "rlqs-abandon-after", file: "rlqs.abandon_after", arg: "duration", zeroMeans: show(rlqs.DefaultAbandonAfter), help: "abandon an Envoy's rate limit quota bucket that reported no requests for this long (Envoy makes it again on its next request)",
			v: duration(func(c *config) *time.Duration { return &c.RLQS.AbandonAfter })},
		{flag: "envoy-response-headers", file: "envoy.response_headers", help: "add envoyproxy/ratelimit's rate limit headers (limit, remaining, seconds to reset of the descriptor closest to its limit) to Envoy's answers, for Envoy to send downstream (LIMIT_RESPONSE_HEADERS_ENABLED)",
			v: boolean(func(c *config) *bool { return &c.EnvoyHeaders.Enabled })},
		{flag: "envoy-response-header-names", file: "envoy.response_header_names", arg: "limit,remaining,reset", unset: "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", help: "names of the three headers of --envoy-response-headers",
			v: text(func(c *config) *string { return &c.EnvoyHeaders.Names })},
		{flag: "envoy-stop-increment-when-over-limit", file: "envoy.stop_increment_when_over_limit", help: "count an Envoy descriptor's hits only when they fit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); by default every hit of a limited rule counts, as envoyproxy/ratelimit counts it, and a counter over its limit denies until its window ends or its refill pays the excess back",
			v: boolean(func(c *config) *bool { return &c.Envoy.StopIncrementWhenOverLimit })},
		{flag: "envoy-merge-domains", file: "envoy.merge_domains", help: "merge the rules of one domain's files in --envoy-config-dir (or from xDS) instead of refusing the second file (MERGE_DOMAIN_CONFIG)",
			v: boolean(func(c *config) *bool { return &c.Envoy.MergeDomains })},
		{flag: "envoy-quota-mode", file: "envoy.quota_mode", help: "make every rule of envoyproxy/ratelimit's files a soft limit, as its quota_mode: a request is over the limit only when every such descriptor of it is (QUOTA_MODE)",
			v: boolean(func(c *config) *bool { return &c.Envoy.QuotaMode })},
		{flag: "envoy-dynamic-metadata", file: "envoy.dynamic_metadata", help: "answer with dynamic_metadata: the domain, the descriptors, and the metadata of the rules within their limits (RESPONSE_DYNAMIC_METADATA)",
			v: boolean(func(c *config) *bool { return &c.Envoy.DynamicMetadata })},
		{flag: "envoy-shadow-mode", file: "envoy.shadow_mode", help: "answer Envoy's rate limit requests OK overall even when over a limit, still counting (envoyproxy/ratelimit's SHADOW_MODE)",
			v: boolean(func(c *config) *bool { return &c.Envoy.ShadowMode })},
		{flag: "envoy-near-limit-ratio", file: "envoy.near_limit_ratio", arg: "fraction", zeroMeans: show(envoy.DefaultNearLimitRatio), help: "share of a limit past which Envoy rule hits count as near_limit in /metrics, in (0, 1]",
			v: number(func(c *config) *float64 { return &c.Envoy.NearLimitRatio }, "0.8")},

		{flag: "console", file: "console.enabled", def: "true", help: "serve the web console at GET / on the API port (playground and live view)",
			v: boolean(func(c *config) *bool { return &c.Console.Enabled })},
		{flag: "console-show-keys", file: "console.show_keys", def: "false", help: "show the keys themselves in the console's top limited keys and GET /status, which answer anyone who reaches the port and may pass --allowed-hosts; false, the default, shows a SHA-256 prefix of each instead",
			v: boolean(func(c *config) *bool { return &c.Console.ShowKeys })},

		{flag: "tls-cert-file", file: "tls.cert_file", arg: "file", unset: "none (cleartext)", help: "PEM file of the API's certificate chain; with --tls-key-file the port serves TLS only (HTTP/2 by ALPN, and HTTP/1.1); re-read when it changes",
			v: text(func(c *config) *string { return &c.TLS.CertFile })},
		{flag: "tls-key-file", file: "tls.key_file", arg: "file", unset: "none (cleartext)", help: "PEM file of the private key of --tls-cert-file",
			v: text(func(c *config) *string { return &c.TLS.KeyFile })},
		{flag: "tls-client-ca-file", file: "tls.client_ca_file", arg: "file", help: "PEM file of the CAs that sign client certificates; set, every client must present one (mutual TLS); needs --tls-cert-file",
			v: text(func(c *config) *string { return &c.TLS.ClientCAFile })},
		{flag: "tls-client-san", file: "tls.client_san", arg: "name", unset: "none", help: "name every client certificate must also carry among its subject alternative names (a DNS name, wildcards matched, or an IP address); needs --tls-client-ca-file",
			v: text(func(c *config) *string { return &c.TLS.ClientSAN })},

		{flag: "allowed-hosts", file: "allowed_hosts", arg: "name,name", unset: "localhost and IP addresses", help: "more Host names (without port) the console, GET /status, GET /cluster and, without --admin-token-file, admin calls answer, besides localhost, names under .localhost and IP addresses (only the loopback ones, or the listen address, when --listen names one); other Hosts get 403, a guard against DNS rebinding; * allows every Host; Check calls, /healthz, /readyz and /metrics are never Host-checked",
			v: hostNames(func(c *config) *[]string { return &c.AllowedHosts })},
		{flag: "admin-token-file", file: "admin_token_file", arg: "file", unset: "none (Reset open)", help: "file holding the bearer token that admin calls (Reset) require: Authorization: Bearer TOKEN; unset, any client whose Host passes the --allowed-hosts check may call Reset",
			v: text(func(c *config) *string { return &c.AdminTokenFile })},

		{flag: "pprof-addr", file: "pprof_addr", arg: "host:port", unset: "none", help: "serve Go's profiler (net/http/pprof under /debug/pprof/) on this address, apart from the API; keep it on loopback",
			v: text(func(c *config) *string { return &c.PprofAddr })},
		{flag: "grpc-transport", file: "grpc_transport", arg: "name", def: grpcTransportGRPCGo, help: "grpc-go: connections whose first request is gRPC are served by grpc-go's transport (a fraction of the CPU per call); connect: every connection by net/http and connect-go, for a proxy in front that mixes gRPC and other requests on one HTTP/2 connection",
			v: text(func(c *config) *string { return &c.GRPCTransport })},
	}
}
