package main

import (
	"flag"
	"fmt"
)

func usage(fs *flag.FlagSet, d config) {
	w := fs.Output()
	fmt.Fprintf(w, `quotad — a distributed quota (rate-limit) service.

Serves quotad.v1.QuotaService over Connect, gRPC, gRPC-Web and HTTP/JSON on one
port (HTTP/1.1 and cleartext HTTP/2, or TLS with --tls-cert-file). With no
flags it listens on %s with the embedded in-memory store; --redis makes
Redis the authoritative store.

Usage:
  quotad [flags]
  quotad check --policy NAME --key KEY [flags]   (one decision; see quotad check --help)
  quotad version                                 (version, commit, Go version)

Settings come from defaults, then the --config file, then QUOTAD_* environment
variables, then flags. SIGHUP, or a change to the content of the --config file or
of the --envoy-config-dir files, reloads them: policies, envoy rules and log_level
apply at once; the rest needs a restart.
Flags:
`, d.Listen)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
Defaults: listen %s, redis-timeout %s, redis-connect-timeout %s, key-prefix %s,
inline-limits %t, default-on-store-error %s, shutdown-timeout %s, log-level %s.

Config file (YAML; unknown fields are errors):
  listen: ":8080"
  redis:
    url: "redis://localhost:6379/0" # or cluster: [host:port, ...]
                                    # or sentinel: [host:port, ...] with master: NAME
    timeout: 50ms
    connect_timeout: 1s             # also username, password, sentinel_username,
                                    # sentinel_password, db, tls, tls_ca_file
  breaker: {failures: 5, probe_every: 250ms}
  max_batch: 1000
  max_request_bytes: 4194304
  max_inline_period: 24h
  memory_max_keys: 250000           # embedded memory store only
  read_timeout: 30s
  idle_timeout: 2m
  max_connections: 10000
  lease: {horizon: 200ms, hold: 500ms, max_fraction: 0.05, max_keys: 50000}
  key_prefix: quotad
  inline_limits: true
  default_on_store_error: open      # open | closed
  shutdown_timeout: 10s
  log_level: info
  tracing: {exporter: otlp-grpc, endpoint: "http://localhost:4317", sample_ratio: 0.1}
  metrics: true                     # Prometheus text at GET /metrics
  console: {enabled: true, show_keys: true}  # the web console at GET /
  tls:                              # optional; the port then serves TLS only
    cert_file: /etc/quotad/tls/tls.crt
    key_file: /etc/quotad/tls/tls.key
    client_ca_file: /etc/quotad/tls/ca.crt  # optional: require client certificates
  admin_token_file: /etc/quotad/admin/token # optional: Reset needs this bearer token
  cluster:                          # optional; needs redis
    addr: ":7946"                   # gossip address (UDP and TCP)
    join: ["quotad-headless:7946"]  # seeds; a DNS name means all its addresses
    node_name: quotad-0             # default hostname:port
    key_file: /etc/quotad/gossip.key  # base64 of 16/24/32 bytes; required
                                    # unless insecure: true (plaintext gossip)
  envoy:                            # Envoy's rate limit service (docs/envoy.md)
    config_dir: /etc/ratelimit/config # envoyproxy/ratelimit's files, unchanged
    shadow_mode: false              # also domains: [...] in quotad's own schema
  policies:
    - name: api                     # [A-Za-z0-9_.-]
      algorithm: token_bucket       # fixed_window | sliding_window_log | sliding_window_counter
                                    # | token_bucket | leaky_bucket | gcra | concurrency
      limit: 100                    # units per period
      period: 1m                    # 1ms to 8760h, whole milliseconds
      burst: 20                     # buckets and gcra; 0 means limit
      on_store_error: closed        # optional: open | closed

Try it:
  curl -s -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check \
    -d '{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}'
`, d.Listen, d.Redis.Timeout, d.Redis.ConnectTimeout, d.KeyPrefix, d.InlineLimits, d.DefaultOnStoreError, d.ShutdownTimeout, d.LogLevel)
}
