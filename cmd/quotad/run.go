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
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node"
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
		{name: "redis", usage: "Redis URL for the authoritative store: redis://[user:password@]host:port/db or rediss:// for TLS; empty uses the embedded memory store (single node)", apply: func(c *config, v string) error { c.RedisURL = v; return nil }},
		{name: "redis-timeout", usage: "deadline of each Redis round trip, one pipelined batch of script calls (`duration`)", apply: func(c *config, v string) error { return parseDurationInto(&c.RedisTimeout, v) }},
		{name: "key-prefix", usage: "prefix of every Redis key, {prefix:policy:key}", apply: func(c *config, v string) error { c.KeyPrefix = v; return nil }},
		{name: "inline-limits", usage: "accept limits sent inline in requests (gubernator-style)", isBool: true, apply: func(c *config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("want true or false, got %q", v)
			}
			c.InlineLimits = b
			return nil
		}},
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
		{name: "denied-cache-entries", usage: "size of the hot denied-key cache in `entries`; 0 with no --denied-cache-bytes means 100000", apply: func(c *config, v string) error { return parseIntInto(&c.DeniedCache.MaxEntries, v) }},
		{name: "denied-cache-bytes", usage: "size of the hot denied-key cache in `bytes` instead of entries", apply: func(c *config, v string) error { return parseIntInto(&c.DeniedCache.MaxBytes, v) }},
		{name: "shutdown-timeout", usage: "how long in-flight requests may take to finish on shutdown (`duration`)", apply: func(c *config, v string) error { return parseDurationInto(&c.ShutdownTimeout, v) }},
		{name: "log-level", usage: "debug, info, warn or error", apply: func(c *config, v string) error { c.LogLevel = v; return nil }},
	}, clusterSettings()...)
}

func parseDurationInto(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q (write e.g. 50ms, 2s)", v)
	}
	*dst = d
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
	fs.Usage = func() { usage(fs, defaults) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, errHelp
		}
		return config{}, err
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
	if path != "" {
		if err := loadFile(&c, path); err != nil {
			return config{}, err
		}
	}
	for _, s := range all {
		if v := getenv(s.env()); v != "" && !set[s.name] {
			if err := s.apply(&c, v); err != nil {
				return config{}, fmt.Errorf("environment %s: %w", s.env(), err)
			}
		}
	}
	for _, s := range all {
		if set[s.name] {
			if err := s.apply(&c, fs.Lookup(s.name).Value.String()); err != nil {
				return config{}, fmt.Errorf("flag --%s: %w", s.name, err)
			}
		}
	}
	if err := c.validate(); err != nil {
		return config{}, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

func usage(fs *flag.FlagSet, d config) {
	w := fs.Output()
	fmt.Fprintf(w, `quotad — a distributed quota (rate-limit) service.

Serves quotad.v1.QuotaService over Connect, gRPC, gRPC-Web and HTTP/JSON on one
port (HTTP/1.1 and cleartext HTTP/2). With no flags it listens on %s with the
embedded in-memory store; --redis makes Redis the authoritative store.

Usage:
  quotad [flags]

Settings come from defaults, then the --config file, then QUOTAD_* environment
variables, then flags. Flags:
`, d.Listen)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
Defaults: listen %s, redis-timeout %s, key-prefix %s, inline-limits %t,
default-on-store-error %s, shutdown-timeout %s, log-level %s.

Config file (YAML; unknown fields are errors):
  listen: ":8080"
  redis: {url: "redis://localhost:6379/0", timeout: 100ms}
  key_prefix: quotad
  inline_limits: true
  default_on_store_error: open      # open | closed
  shutdown_timeout: 10s
  log_level: info
  cluster:                          # optional; needs redis
    addr: ":7946"                   # gossip address (UDP and TCP)
    join: ["quotad-headless:7946"]  # seeds; a DNS name means all its addresses
    node_name: quotad-0             # default hostname:port
    key_file: /etc/quotad/gossip.key  # base64 of 16/24/32 bytes
  policies:
    - name: api                     # [A-Za-z0-9_.-]
      algorithm: token_bucket       # fixed_window | sliding_window_log | sliding_window_counter
                                    # | token_bucket | leaky_bucket | gcra
      limit: 100                    # units per period
      period: 1m                    # 1ms to 8760h, whole milliseconds
      burst: 20                     # buckets and gcra; 0 means limit
      on_store_error: closed        # optional: open | closed

Try it:
  curl -s -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check \
    -d '{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}'
`, d.Listen, d.RedisTimeout, d.KeyPrefix, d.InlineLimits, d.DefaultOnStoreError, d.ShutdownTimeout, d.LogLevel)
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level: want debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// run is quotad: it serves until ctx is done, then shuts down in order:
// stop accepting and finish in-flight requests, then close the store.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	level, _ := parseLogLevel(cfg.LogLevel) // validated
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

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
	nodeCfg.Cluster = cluster // n leaves it in Close, after the server stops
	n, err := node.New(nodeCfg, store, log)
	if err != nil {
		store.Close()
		cluster.Close()
		return err
	}
	defer n.Close()

	handler, err := rpc.NewHandler(n, cfg.rpcConfig(), log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		Protocols:         new(http.Protocols),
	}
	// One port for every protocol: HTTP/1.1 for Connect and JSON, cleartext
	// HTTP/2 (h2c) for gRPC.
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)

	fmt.Fprintf(stdout, "quotad listening on %s (Connect, gRPC, gRPC-Web, HTTP/JSON)\nstore: %s\npolicies: %d configured, inline limits %s\n",
		displayURL(ln.Addr()), n.Store(), len(cfg.Policies), map[bool]string{true: "on", false: "off"}[cfg.InlineLimits])
	if cluster != nil {
		fmt.Fprintf(stdout, "cluster: %s\n", cluster.Describe())
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func openStore(ctx context.Context, cfg config) (node.Store, error) {
	if cfg.RedisURL == "" {
		return node.NewMemoryStore(nil, 0), nil
	}
	s, err := node.NewRedisStore(ctx, cfg.redisConfig())
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	return s, nil
}

// displayURL turns a listener address into something a user can paste:
// an unspecified host ("[::]" or "0.0.0.0") becomes localhost.
func displayURL(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return "http://" + a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}
