package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memcache"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/rlqs"
)

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
	return runWith(ctx, args, getenv, stdout, stderr, nil)
}

// alsoServe opens more listeners for the API handler once it serves, each
// with its own routes in front (`quotad envoy-ratelimit`'s HTTP and
// metrics ports); it returns what to print and the servers to shut down.
type alsoServe func(api http.Handler, health *rpc.Health, log *slog.Logger) ([]string, []*http.Server, []net.Listener, error)

// runWith is run, with the extra listeners also opens (nil: none).
func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, also alsoServe) error {
	ld, err := load(args, getenv, stderr)
	if errors.Is(err, errVersion) {
		_, err = fmt.Fprintln(stdout, versionText())
		return err
	}
	if err != nil {
		return err
	}
	if ld.printSettings {
		return printSettings(stdout, ld)
	}
	cfg := ld.config
	// The level is a variable: a reload may change it.
	level := new(slog.LevelVar)
	l, _ := parseLogLevel(cfg.LogLevel) // validated
	level.Set(l)
	var logs slog.Handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	if cfg.LogFormat == "json" {
		logs = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(logs)
	logOtelTo(log)
	envoy, envoyFiles, err := loadEnvoy(cfg)
	if err != nil {
		return err
	}
	if cfg.EnvoyXDS.Server != "" {
		// Its TLS files are read once, here: a mistake stops quotad now.
		if _, err := cfg.EnvoyXDS.clientConfig(); err != nil {
			return err
		}
	}

	// Telemetry starts first and stops last (deferred calls run in
	// reverse), after the node has closed.
	tel, err := startTelemetry(ctx, cfg.Telemetry, getenv, stdout, log)
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
	rpcCfg.Envoy = envoy
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
	// With a certificate: TLS only, HTTP/2 by ALPN; the cluster view then
	// asks the members over TLS too, with the same files.
	if cfg.Server.TLS, rpcCfg.Members.TLS, err = apiTLS(cfg.TLS, log); err != nil {
		return err
	}
	rpcCfg.Members.APIPort = cfg.Cluster.APIPort
	// Envoy's rate limit quota service runs its rounds until shutdown
	// begins; its streams end then, and Envoys open new ones elsewhere.
	stopRLQS := func() {}
	if cfg.RLQS.Serves() {
		svc, err := rlqs.New(n, cfg.RLQS, cfg.Policies, tel.meter, log)
		if err != nil {
			return err
		}
		rpcCfg.RLQS = svc
		rlqsCtx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); svc.Run(rlqsCtx) }()
		stopRLQS = func() { cancel(); <-done }
		defer stopRLQS()
	}
	handler, err := rpc.NewHandler(n, rpcCfg, log)
	if err != nil {
		return err
	}
	stopReload := reload.start(ctx, n, handler)
	defer stopReload()
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
	if also != nil {
		lines, servers, listeners, err := also(tel.handler(handler), health, log)
		if err != nil {
			ln.Close()
			return err
		}
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
		for i, s := range servers {
			go func() { serveErr <- s.Serve(listeners[i]) }()
			defer s.Close()
		}
	}
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
	stopRLQS()
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
	ln, err := listen(cfg.Listen)
	if err != nil {
		return nil, nil, err
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
	if cfg.usesMemcache() {
		mc := cfg.Memcache
		var err error
		if mc.TLS, err = cfg.MemcacheTLS.load(); err != nil {
			return nil, err
		}
		s, err := memcache.New(ctx, mc)
		if err != nil {
			return nil, fmt.Errorf("memcache store: %w", err)
		}
		return s, nil
	}
	if !cfg.usesRedis() {
		return memory.Open(memory.Config{MaxKeys: cfg.MemoryMaxKeys})
	}
	rc := cfg.Redis
	rc.ReadFile = readFile // its CA file, as every file quotad reads
	s, err := redis.New(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	return s, nil
}

// displayURL turns a listener address into something a user can paste:
// an unspecified host ("[::]" or "0.0.0.0") becomes localhost, and the
// scheme is https when the port serves TLS; a Unix socket is unix:PATH,
// as --listen takes it.
func displayURL(a net.Addr, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	if a.Network() == "unix" {
		return unixListenPrefix + a.String()
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
