package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node"
)

// setting is one configuration knob settable by flag and by environment
// variable (QUOTAD_ + the flag name upper-cased, '-' as '_').
type setting struct {
	name, usage string
	isBool      bool
	apply       func(c *config, v string) error
}

func (s setting) env() string {
	return "QUOTAD_" + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_"))
}

func settings() []setting {
	return append([]setting{
		{name: "listen", usage: "address the API listens on (`host:port`)", apply: func(c *config, v string) error { c.Listen = v; return nil }},
		{name: "redis", usage: "Redis URL for the authoritative store: redis://[user:password@]host:port/db or rediss:// for TLS; no Redis at all uses the embedded memory store (single node)", apply: func(c *config, v string) error { c.Redis.URL = v; return nil }},
		{name: "redis-cluster", usage: "Redis Cluster seed addresses instead of --redis (`host:port,host:port`)", apply: func(c *config, v string) error { return parseAddrsInto(&c.Redis.ClusterAddrs, v) }},
		{name: "redis-sentinel", usage: "Sentinel addresses instead of --redis (`host:port,host:port`); needs --redis-master", apply: func(c *config, v string) error { return parseAddrsInto(&c.Redis.SentinelAddrs, v) }},
		{name: "redis-master", usage: "`name` of the master the sentinels watch", apply: func(c *config, v string) error { c.Redis.MasterName = v; return nil }},
		{name: "redis-username", usage: "ACL `user` for --redis-cluster and --redis-sentinel servers (a URL carries its own)", apply: func(c *config, v string) error { c.Redis.Username = v; return nil }},
		{name: "redis-password", usage: "`password` for --redis-cluster and --redis-sentinel servers; prefer the environment variable", apply: func(c *config, v string) error { c.Redis.Password = v; return nil }},
		{name: "redis-sentinel-username", usage: "ACL `user` for the sentinels themselves", apply: func(c *config, v string) error { c.Redis.SentinelUsername = v; return nil }},
		{name: "redis-sentinel-password", usage: "`password` for the sentinels themselves", apply: func(c *config, v string) error { c.Redis.SentinelPassword = v; return nil }},
		{name: "redis-db", usage: "database `number` behind Sentinel (a URL names its own; Cluster has only 0)", apply: func(c *config, v string) error { return parseIntInto32(&c.Redis.DB, v) }},
		{name: "redis-tls", usage: "use TLS with --redis-cluster and --redis-sentinel (rediss:// does it for --redis)", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.Redis.TLS, v) }},
		{name: "redis-tls-ca", usage: "PEM `file` of the certificate authorities to trust for Redis TLS instead of the system's", apply: func(c *config, v string) error { c.Redis.TLSCAFile = v; return nil }},
		{name: "redis-timeout", usage: "deadline of each Redis call, queueing included (`duration`); past it the policy's failure mode decides", apply: func(c *config, v string) error { return parseDurationInto(&c.Redis.Timeout, v) }},
		{name: "redis-connect-timeout", usage: "deadline of opening a Redis connection (dial, TLS, HELLO) and of a circuit-breaker probe, apart from --redis-timeout (`duration`)", apply: func(c *config, v string) error { return parseDurationInto(&c.Redis.ConnectTimeout, v) }},
		{name: "breaker-failures", usage: "Redis calls failing in a row that open the circuit breaker (`count`); while open, checks take their failure mode at once; 0 takes the default 5", apply: func(c *config, v string) error { return parseIntInto32(&c.Breaker.Failures, v) }},
		{name: "breaker-probe-every", usage: "how often an open breaker pings Redis; the first answer closes it (`duration`); 0 takes the default 250ms", apply: func(c *config, v string) error { return parseDurationInto(&c.Breaker.ProbeEvery, v) }},
		{name: "key-prefix", usage: "prefix of every Redis key, {prefix:policy:key}", apply: func(c *config, v string) error { c.KeyPrefix = v; return nil }},
		{name: "inline-limits", usage: "accept limits sent inline in requests (gubernator-style)", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.InlineLimits, v) }},
		{name: "default-on-store-error", usage: "failure mode of policies that set none: open or closed", apply: func(c *config, v string) error {
			m, err := node.ParseFailureMode(v)
			c.DefaultOnStoreError = m
			return err
		}},
		{name: "lease-horizon", usage: "a lease covers about this much of a key's recent demand on this node (`duration`); 0 takes the default 200ms", apply: func(c *config, v string) error { return parseDurationInto(&c.Lease.Horizon, v) }},
		{name: "lease-hold", usage: "longest a lease is spent before its unused units go back to Redis (`duration`, at least the horizon); 0 takes the default 500ms", apply: func(c *config, v string) error { return parseDurationInto(&c.Lease.Hold, v) }},
		{name: "lease-max-fraction", usage: "all nodes' leases on one key together hold at most this `fraction` of its limit, in (0, 1]; 0 takes the default 0.05", apply: func(c *config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("want a number such as 0.05, got %q", v)
			}
			c.Lease.MaxFraction = f
			return nil
		}},
		{name: "lease-max-keys", usage: "most keys a node tracks for leasing (`count`); at the bound, other keys go to Redis one check at a time; 0 takes the default 50000", apply: func(c *config, v string) error { return parseIntInto32(&c.Lease.MaxKeys, v) }},
		{name: "denied-cache-entries", usage: "size of the hot denied-key cache in `entries`; 0 with no --denied-cache-bytes means 100000", apply: func(c *config, v string) error { return parseIntInto(&c.DeniedCache.MaxEntries, v) }},
		{name: "denied-cache-bytes", usage: "size of the hot denied-key cache in `bytes` instead of entries", apply: func(c *config, v string) error { return parseIntInto(&c.DeniedCache.MaxBytes, v) }},
		{name: "max-batch", usage: "most checks one CheckBatch may carry, 1 to 1000 (`count`); 0 means 1000", apply: func(c *config, v string) error { return parseIntInto32(&c.MaxBatch, v) }},
		{name: "max-request-bytes", usage: "largest request message accepted (`bytes`, after decompression); larger ones fail with ResourceExhausted; 0 means 4 MiB", apply: func(c *config, v string) error { return parseIntInto32(&c.MaxRequestBytes, v) }},
		{name: "max-inline-period", usage: "longest an inline limit's state may live (`duration`): its period, or for buckets and gcra the time to restore a full burst; longer is InvalidArgument; 0 means 24h, 8760h allows every period", apply: func(c *config, v string) error { return parseDurationInto(&c.MaxInlinePeriod, v) }},
		{name: "memory-max-keys", usage: "most keys the embedded memory store holds (`count`); at the bound, checks of new keys fail with ResourceExhausted; 0 means 250000", apply: func(c *config, v string) error { return parseIntInto32(&c.MemoryMaxKeys, v) }},
		{name: "read-timeout", usage: "how long a request body may take to arrive (`duration`); 0 means 30s", apply: func(c *config, v string) error { return parseDurationInto(&c.Server.ReadTimeout, v) }},
		{name: "idle-timeout", usage: "a connection with no request in flight for this long is closed (`duration`); 0 means 2m", apply: func(c *config, v string) error { return parseDurationInto(&c.Server.IdleTimeout, v) }},
		{name: "max-connections", usage: "most API connections open at once (`count`); at the bound a new one replaces the longest idle, or is closed if none is idle; 0 means 10000", apply: func(c *config, v string) error { return parseIntInto32(&c.Server.MaxConnections, v) }},
		{name: "shutdown-timeout", usage: "how long in-flight requests may take to finish on shutdown (`duration`)", apply: func(c *config, v string) error { return parseDurationInto(&c.ShutdownTimeout, v) }},
		{name: "log-level", usage: "debug, info, warn or error", apply: func(c *config, v string) error { c.LogLevel = v; return nil }},
	}, slices.Concat(telemetrySettings(), clusterSettings(), envoySettings(), consoleSettings(), tlsSettings(), adminSettings())...)
}

func parseDurationInto(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q (write e.g. 50ms, 2s)", v)
	}
	*dst = d
	return nil
}

func parseBoolInto(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("want true or false, got %q", v)
	}
	*dst = b
	return nil
}

// parseAddrsInto splits a comma-separated list of addresses; empty items
// are an error rather than silently dropped.
func parseAddrsInto(dst *[]string, v string) error {
	addrs := strings.Split(v, ",")
	for i, a := range addrs {
		addrs[i] = strings.TrimSpace(a)
		if addrs[i] == "" {
			return fmt.Errorf("empty address in %q (want host:port,host:port)", v)
		}
	}
	*dst = addrs
	return nil
}

func parseIntInto32(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("want a whole number, got %q", v)
	}
	*dst = n
	return nil
}

func parseIntInto(dst *int64, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("want a whole number, got %q", v)
	}
	*dst = n
	return nil
}

func telemetrySettings() []setting {
	return []setting{
		{name: "trace-exporter", usage: "where spans go: none, otlp-grpc, otlp-http or stdout; unset reads OTEL_TRACES_EXPORTER (otlp, console, none), else none", apply: func(c *config, v string) error { c.Telemetry.TraceExporter = v; return nil }},
		{name: "trace-endpoint", usage: "OTLP collector for spans: `URL` (http://collector:4317, http means no TLS) or host:port; unset reads OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT", apply: func(c *config, v string) error { c.Telemetry.TraceEndpoint = v; return nil }},
		{name: "trace-sample-ratio", usage: "share of new traces recorded, 0 to 1 (requests carrying trace context follow their caller); unset reads OTEL_TRACES_SAMPLER, else 1", apply: func(c *config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("want a number such as 0.01, got %q", v)
			}
			c.Telemetry.TraceSampleRatio = &f
			return nil
		}},
		{name: "metrics", usage: "serve Prometheus metrics at GET /metrics on the API port", isBool: true, apply: func(c *config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("want true or false, got %q", v)
			}
			c.Telemetry.Metrics = b
			return nil
		}},
	}
}

func clusterSettings() []setting {
	return []setting{
		{name: "cluster-addr", usage: "gossip address (`host:port`, UDP and TCP) that makes this node a cluster member; host an IP or empty for all interfaces; needs --redis", apply: func(c *config, v string) error { c.Cluster.Addr = v; return nil }},
		{name: "cluster-advertise", usage: "address the other nodes reach this one at (`host:port`), when it differs from --cluster-addr", apply: func(c *config, v string) error { c.Cluster.Advertise = v; return nil }},
		{name: "join", usage: "cluster seeds to join, `host:port[,host:port...]`; a DNS name stands for every address it resolves to (a Kubernetes headless service)", apply: func(c *config, v string) error { return parseAddrsInto(&c.Cluster.Join, v) }},
		{name: "node-name", usage: "this node's name in the cluster, unique; default hostname:port", apply: func(c *config, v string) error { c.Cluster.NodeName = v; return nil }},
		{name: "cluster-key-file", usage: "`file` with the shared gossip key that encrypts and authenticates the cluster: base64 of 16, 24 or 32 bytes (openssl rand -base64 32), or the raw bytes; required with --cluster-addr unless --cluster-insecure", apply: func(c *config, v string) error { c.Cluster.KeyFile = v; return nil }},
		{name: "cluster-insecure", usage: "gossip without --cluster-key-file: unencrypted and unauthenticated, so anyone who reaches --cluster-addr can join, read and forge gossip (a forged denial still lasts no longer than its limit could justify); only for a network nobody else reaches", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.Cluster.Insecure, v) }},
		{name: "cluster-dead-after", usage: "a member that stops answering is dropped from the cluster after about this long (`duration`); 0 takes the default 5s", apply: func(c *config, v string) error { return parseDurationInto(&c.Cluster.DeadAfter, v) }},
		{name: "cluster-rejoin-interval", usage: "how often seeds and dead members are re-joined, which heals partitions (`duration`); 0 takes the default 10s", apply: func(c *config, v string) error { return parseDurationInto(&c.Cluster.RejoinInterval, v) }},
	}
}

// envoySettings are the flags (and QUOTAD_* variables) of Envoy's rate
// limit service.
func envoySettings() []setting {
	return []setting{
		{name: "envoy-config-dir", usage: "`directory` of envoyproxy/ratelimit config files (*.yaml, *.yml; one domain each), served unchanged by Envoy's rate limit service and reloaded when they change", apply: func(c *config, v string) error { c.EnvoyDir = v; return nil }},
		{name: "envoy-shadow-mode", usage: "answer Envoy's rate limit requests OK overall even when over a limit, still counting (envoyproxy/ratelimit's SHADOW_MODE)", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.Envoy.ShadowMode, v) }},
		{name: "envoy-near-limit-ratio", usage: "share of a limit past which Envoy rule hits count as near_limit in /metrics, in (0, 1]; 0 takes the default 0.8", apply: func(c *config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("want a number such as 0.8, got %q", v)
			}
			c.Envoy.NearLimitRatio = f
			return nil
		}},
	}
}

func consoleSettings() []setting {
	return []setting{
		{name: "console", usage: "serve the web console at GET / on the API port (playground and live view)", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.Console.Enabled, v) }},
		{name: "console-show-keys", usage: "show keys in the console's top limited keys and GET /status; false shows a SHA-256 prefix of each instead", isBool: true, apply: func(c *config, v string) error { return parseBoolInto(&c.Console.ShowKeys, v) }},
	}
}

func tlsSettings() []setting {
	return []setting{
		{name: "tls-cert-file", usage: "PEM `file` of the API's certificate chain; with --tls-key-file the port serves TLS only (HTTP/2 by ALPN, and HTTP/1.1); re-read when it changes", apply: func(c *config, v string) error { c.TLS.CertFile = v; return nil }},
		{name: "tls-key-file", usage: "PEM `file` of the private key of --tls-cert-file", apply: func(c *config, v string) error { c.TLS.KeyFile = v; return nil }},
		{name: "tls-client-ca-file", usage: "PEM `file` of the CAs that sign client certificates; set, every client must present one (mutual TLS); needs --tls-cert-file", apply: func(c *config, v string) error { c.TLS.ClientCAFile = v; return nil }},
	}
}

func adminSettings() []setting {
	return []setting{
		{name: "admin-token-file", usage: "`file` holding the bearer token that admin calls (Reset) require: Authorization: Bearer TOKEN; unset, any client may call Reset", apply: func(c *config, v string) error { c.AdminTokenFile = v; return nil }},
	}
}
