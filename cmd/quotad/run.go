package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
)

// errHelp means --help was asked for and printed; main exits 0.
var errHelp = errors.New("help requested")

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
		{name: "max-request-bytes", usage: "largest CheckBatch or Envoy ShouldRateLimit message accepted (`bytes`, after decompression; other calls' are bounded at 64 KiB, or this if smaller); larger ones fail with ResourceExhausted; 0 means 2 MiB", apply: func(c *config, v string) error { return parseIntInto32(&c.MaxRequestBytes, v) }},
		{name: "max-inline-period", usage: "longest an inline limit's state may live (`duration`): its period, or for buckets and gcra the time to restore a full burst; longer is InvalidArgument; 0 means 24h, 8760h allows every period", apply: func(c *config, v string) error { return parseDurationInto(&c.MaxInlinePeriod, v) }},
		{name: "memory-max-keys", usage: "most keys the embedded memory store holds (`count`); at the bound, checks of new keys fail with ResourceExhausted; 0 means 250000", apply: func(c *config, v string) error { return parseIntInto32(&c.MemoryMaxKeys, v) }},
		{name: "read-timeout", usage: "how long a request body may take to arrive (`duration`), except gRPC on grpc-go; 0 means 30s", apply: func(c *config, v string) error { return parseDurationInto(&c.Server.ReadTimeout, v) }},
		{name: "idle-timeout", usage: "a connection with no request in flight for this long is closed (`duration`); 0 means 2m", apply: func(c *config, v string) error { return parseDurationInto(&c.Server.IdleTimeout, v) }},
		{name: "max-connections", usage: "most API connections open at once (`count`); at the bound a new one replaces the longest idle, or is closed if none is idle; 0 means 10000", apply: func(c *config, v string) error { return parseIntInto32(&c.Server.MaxConnections, v) }},
		{name: "shutdown-timeout", usage: "how long in-flight requests may take to finish on shutdown (`duration`)", apply: func(c *config, v string) error { return parseDurationInto(&c.ShutdownTimeout, v) }},
		{name: "log-level", usage: "debug, info, warn or error", apply: func(c *config, v string) error { c.LogLevel = v; return nil }},
	}, slices.Concat(telemetrySettings(), clusterSettings(), envoySettings(), consoleSettings(), tlsSettings(), adminSettings(), pprofSettings(), transportSettings())...)
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

// textFlag and boolFlag hold a flag's raw text; settings parse it, so that
// flags, environment and file share one parser per knob.
type textFlag struct{ v string }

func (f *textFlag) String() string     { return f.v }
func (f *textFlag) Set(v string) error { f.v = v; return nil }

type boolFlag struct{ textFlag }

func (*boolFlag) IsBoolFlag() bool { return true }

// loadConfig builds the configuration: defaults, then the --config file,
// then QUOTAD_* environment variables, then flags.
func loadConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("quotad", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML config `file` (policies and any setting below); flags and environment override it")
	all := settings()
	defaults := defaultConfig()
	for _, s := range all {
		if s.isBool {
			fs.Var(&boolFlag{}, s.name, s.usage+" (env "+s.env()+")")
		} else {
			fs.Var(&textFlag{}, s.name, s.usage+" (env "+s.env()+")")
		}
	}
	showVersion := fs.Bool("version", false, "print quotad's version, commit and Go version, and exit (also: quotad version)")
	fs.Usage = func() { usage(fs, defaults) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, errHelp
		}
		return config{}, err
	}
	if *showVersion {
		return config{}, errVersion
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q (see quotad --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	c := defaults
	path := *configPath
	if path == "" {
		path = getenv("QUOTAD_CONFIG")
	}
	var doc *yamlDoc
	if path != "" {
		var err error
		if doc, err = loadFile(&c, path); err != nil {
			return config{}, err
		}
	}
	overrides := map[string]bool{}
	for _, s := range all {
		if v := getenv(s.env()); v != "" && !set[s.name] {
			if err := s.apply(&c, v); err != nil {
				return config{}, fmt.Errorf("environment %s: %w", s.env(), err)
			}
			overrides[s.name] = true
		}
	}
	for _, s := range all {
		if set[s.name] {
			if err := s.apply(&c, fs.Lookup(s.name).Value.String()); err != nil {
				return config{}, fmt.Errorf("flag --%s: %w", s.name, err)
			}
			overrides[s.name] = true
		}
	}
	if err := c.validate(); err != nil {
		return config{}, mergedError(err, doc, overrides)
	}
	return c, nil
}

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
inline-limits %t, default-on-store-error %s, shutdown-timeout %s, log-level %s,
grpc-transport %s.

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
  max_request_bytes: 2097152
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
  pprof_addr: "127.0.0.1:6060"      # Go's profiler; default off
  grpc_transport: grpc-go           # or connect: gRPC on net/http too
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
`, d.Listen, d.Redis.Timeout, d.Redis.ConnectTimeout, d.KeyPrefix, d.InlineLimits, d.DefaultOnStoreError, d.ShutdownTimeout, d.LogLevel, d.GRPCTransport)
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level: want debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// run is quotad: it serves until ctx is done, then shuts down in this
// order (docs in the README, "Shutdown"):
//
//  1. readiness turns NOT_SERVING (gRPC health, /readyz), so load balancers
//     stop sending;
//  2. the listener closes and in-flight requests finish, for up to
//     --shutdown-timeout; connections still busy then are cut;
//  3. the node returns its leases' unused units to Redis;
//  4. the Redis connections close;
//  5. telemetry flushes its last spans (deferred, so it runs last).
//
// It returns nil after a shutdown that ctx asked for.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, getenv, stderr)
	if errors.Is(err, errVersion) {
		_, err = fmt.Fprintln(stdout, versionText())
		return err
	}
	if err != nil {
		return err
	}
	// The level is a variable: a reload may change it.
	level := new(slog.LevelVar)
	l, _ := parseLogLevel(cfg.LogLevel) // validated
	level.Set(l)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	logOtelTo(log)
	envoy, envoyFiles, err := loadEnvoy(cfg)
	if err != nil {
		return err
	}

	// Telemetry starts first and stops last (deferred calls run in
	// reverse), after the node has closed.
	tel, err := startTelemetry(ctx, cfg.Telemetry, getenv, stdout)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer tel.shutdownLogged(log, cfg.ShutdownTimeout)

	store, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	cluster, err := openCluster(cfg, log)
	if err != nil {
		store.Close()
		return err
	}
	nodeCfg := cfg.nodeConfig()
	nodeCfg.Telemetry = tel.node()
	if cluster != nil {
		nodeCfg.Cluster = cluster // n leaves it in Close, after the server stops
	}
	n, err := node.New(nodeCfg, store, log)
	if err != nil {
		store.Close()
		cluster.Close()
		return err
	}
	defer n.Close()

	health := rpc.NewHealth(n)
	rpcCfg := cfg.rpcConfig()
	rpcCfg.Health = health
	rpcCfg.Telemetry = tel.rpc()
	rpcCfg.EnvoyRules = envoy
	if rpcCfg.AdminToken, err = readAdminToken(cfg.AdminTokenFile); err != nil {
		return err
	}
	// SIGHUP and changed files reload the configuration (reload.go); SIGHUP
	// never ends quotad. The console shows the reloader's generation.
	reload, err := newReloader(cfg, envoyFiles, args, getenv, log, level, tel.meter)
	if err != nil {
		return err
	}
	rpcCfg.ConfigVersion = reload.configVersion()
	rpcCfg.ConfigGeneration = reload.configGeneration
	handler, err := rpc.NewHandler(n, rpcCfg, log)
	if err != nil {
		return err
	}
	stopReload := reload.start(ctx, n, handler)
	defer stopReload()
	// With a certificate: TLS only, HTTP/2 by ALPN.
	if cfg.Server.TLS, err = serverTLS(cfg.TLS, log); err != nil {
		return err
	}
	srv, ln, err := listenAPI(cfg, handler, tel.handler(handler), tel.rpc(), log)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "quotad listening on %s (Connect, gRPC, gRPC-Web, HTTP/JSON)\nstore: %s\npolicies: %d configured, inline limits %s\n",
		displayURL(ln.Addr(), cfg.TLS.enabled()), n.Store(), len(cfg.Policies), map[bool]string{true: "on", false: "off"}[cfg.InlineLimits])
	fmt.Fprintln(stdout, tel.describe())
	fmt.Fprintln(stdout, cfg.Console.describe(displayURL(ln.Addr(), cfg.TLS.enabled())))
	if d := cfg.TLS.describe(); d != "" {
		fmt.Fprintln(stdout, d)
	}
	if cluster != nil {
		fmt.Fprintf(stdout, "cluster: %s\n", cluster.Describe())
	}
	if line := describeEnvoy(cfg, envoy); line != "" {
		fmt.Fprintln(stdout, line)
	}
	if cfg.PprofAddr != "" {
		prof, err := startProfiler(cfg.PprofAddr, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer prof.stop()
		fmt.Fprintf(stdout, "pprof: %s/debug/pprof/\n", displayURL(prof.addr, false))
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stopReload() // no reload once shutdown begins: the node is about to close
	started := time.Now()
	log.Info("shutting down: draining", "timeout", cfg.ShutdownTimeout)
	health.Drain()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Streams such as a health Watch never finish on their own; what is
		// still open at the deadline is cut so the rest of the order runs.
		log.Warn("shutdown: requests still running at the deadline were cut", "err", err)
		srv.Close()
	}
	held := n.Stats().UnitsHeld
	if err := n.Close(); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("shut down", "lease_units_given_back", held, "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// listenAPI opens the API's listener on cfg.Listen and the server that
// serves api on it, one port for every protocol (HTTP/1.1 for Connect and
// JSON, cleartext HTTP/2 for gRPC, gRPC connections on grpc-go unless
// --grpc-transport=connect; with a certificate, TLS only and HTTP/2
// by ALPN), within cfg's timeouts and connection cap. It is where the
// API's socket and server are set up.
func listenAPI(cfg config, h *rpc.Handler, api http.Handler, tel rpc.Telemetry, log *slog.Logger) (*rpc.Server, net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	serverCfg := cfg.Server
	serverCfg.Telemetry = tel
	serverCfg.ConnectOnly = cfg.GRPCTransport == grpcTransportConnect
	srv, err := rpc.NewServer(h, api, serverCfg, log)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return srv, ln, nil
}

func openStore(ctx context.Context, cfg config) (node.Store, error) {
	if !cfg.usesRedis() {
		return memory.Open(memory.Config{MaxKeys: cfg.MemoryMaxKeys})
	}
	s, err := redis.New(ctx, cfg.Redis)
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	return s, nil
}

// displayURL turns a listener address into something a user can paste:
// an unspecified host ("[::]" or "0.0.0.0") becomes localhost, and the
// scheme is https when the port serves TLS.
func displayURL(a net.Addr, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return scheme + a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return scheme + net.JoinHostPort(host, port)
}
