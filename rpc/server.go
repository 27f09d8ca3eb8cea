package rpc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	"github.com/quotad/quotad/rpc/guard"
)

// Defaults of ServerConfig.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxConnections    = 10_000
	// DefaultMaxConcurrentStreams is Go's own default, stated so that the
	// bound is visible: a client needs no more streams on one connection
	// (it opens another), and 250 handlers per connection is plenty.
	DefaultMaxConcurrentStreams = 250
)

// HTTP/2 health checks: a connection that sends nothing for
// http2PingAfter is pinged, and closed if the ping is not answered within
// http2PingTimeout; a write that makes no progress for
// http2WriteByteTimeout closes the connection. These find dead peers
// under long streams (a health Watch) that no idle timeout sees.
const (
	http2PingAfter        = time.Minute
	http2PingTimeout      = 15 * time.Second
	http2WriteByteTimeout = 30 * time.Second
)

// gRPC front end's own bounds.
const (
	// maxHeaderListBytes bounds a gRPC request's headers as net/http bounds
	// an HTTP request's by default (http.DefaultMaxHeaderBytes).
	maxHeaderListBytes = 1 << 20
	// keepaliveMinTime: a gRPC client that pings more often than this is
	// told to go away (GOAWAY too_many_pings). It is the shortest interval
	// grpc-go's clients allow themselves; grpc-go's server default is 5
	// minutes, which punishes clients net/http never minded.
	keepaliveMinTime = 10 * time.Second
	// streamWorkers is the fewest long-lived goroutines that run gRPC
	// calls: as many as the calls that wait on Redis at once under a few
	// dozen clients. With 8 (four per core on two), a lease: off key at 16
	// clients left half its calls to new goroutines, and 4% of the CPU
	// went to growing their stacks. An idle worker costs only its stack.
	streamWorkers = 64
)

// ServerConfig bounds what clients can hold of the API's HTTP server:
// time, connections and HTTP/2 streams. The zero value is the default.
// Build it with defaults, apply overrides, then Validate (NewServer does).
type ServerConfig struct {
	// ReadHeaderTimeout is how long a connection may take to send a
	// request's headers (HTTP/1.1) once it starts one; a new connection
	// gets as long for its TLS handshake and its first request's headers
	// together, HTTP/2 included (they decide its front end; past it the
	// connection is closed, an HTTP/2 one after a GOAWAY), and a gRPC one
	// as long for grpc-go's connection setup. Until its first request's
	// headers have ended, a connection holds at most 16 KiB of the
	// server's memory. 0 means DefaultReadHeaderTimeout (10s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout is how long a request's body may take to arrive, from
	// its headers to its last byte; a body still arriving then fails the
	// request (HTTP/1.1 then closes the connection). It does not apply to
	// the response, so server streams (a health Watch, whose request ends
	// at once) last as long as the client wants; a stream whose client
	// keeps its own side open (gRPC reflection) is cut after it. The gRPC
	// front end does not apply it: there a request that never ends holds
	// one of its connection's MaxConcurrentStreams until the connection
	// goes. 0 means DefaultReadTimeout (30s).
	ReadTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight for this
	// long: an HTTP/1.1 keep-alive connection between requests, an HTTP/2
	// connection (net/http's or grpc-go's) with no open stream (with a
	// GOAWAY). 0 means DefaultIdleTimeout (2m).
	IdleTimeout time.Duration
	// MaxConnections bounds the connections open at once. A connection
	// that arrives at the bound takes the place of the one idle for the
	// longest (no request in flight, or none sent yet), which is closed;
	// when every connection is busy it is closed at once instead. Both
	// front ends' connections count. 0 means DefaultMaxConnections
	// (10,000).
	MaxConnections int
	// MaxConcurrentStreams bounds the streams (requests) one HTTP/2
	// connection may have open, on either front end. 0 means
	// DefaultMaxConcurrentStreams (250).
	MaxConcurrentStreams int
	// MaxConnectionAge, when not 0, asks a connection to go once it is
	// this old, plus or minus a tenth of it: a gRPC connection (grpc-go's
	// keepalive) or an HTTP/2 one gets a GOAWAY that lets its streams
	// finish and opens no new one, an HTTP/1.1 one a "Connection: close"
	// on its next response (guard.NewAgingListener). Clients then open
	// new connections, which a load balancer in front spreads. 0 (the
	// default) never does.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace, when not 0, closes a connection this long
	// after MaxConnectionAge, whatever is still in flight on it. 0 waits
	// for its requests however long they take. Needs MaxConnectionAge.
	MaxConnectionAgeGrace time.Duration
	// Telemetry: with a MeterProvider the server reports its connections
	// and GOAWAYs (docs/observability.md).
	Telemetry Telemetry
	// TLS, when not nil, makes the port serve TLS only: HTTP/2 by ALPN and
	// HTTP/1.1, no cleartext. Its certificates come from its own fields or
	// callbacks (GetConfigForClient); NextProtos should offer "h2" and
	// "http/1.1" (both are offered when it has none). The server ends TLS
	// itself, before it splits connections between the front ends, so the
	// rapid-reset guard reads the HTTP/2 frames inside TLS too. nil (the
	// default) serves cleartext HTTP/1.1 and h2c.
	TLS *tls.Config
	// ConnectOnly serves every connection on net/http, gRPC included (on
	// connect-go, several times the CPU per call). Default false: a
	// connection whose first request is gRPC (application/grpc, protobuf)
	// goes to grpc-go. Set it when a proxy in front sends gRPC and other
	// requests on one HTTP/2 connection, which grpc-go would answer 415
	// for the others.
	ConnectOnly bool
}

// Validate reports the first problem with c. Zero values are valid: they
// stand for the defaults.
func (c ServerConfig) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read header timeout", c.ReadHeaderTimeout}, {"read timeout", c.ReadTimeout}, {"idle timeout", c.IdleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%s: %w: %s must not be negative (0 means the default)", d.name, ErrInvalidConfig, d.v)
		}
	}
	if c.MaxConnectionAge < 0 || c.MaxConnectionAgeGrace < 0 {
		return fmt.Errorf("max connection age: %w: %s and grace %s must not be negative (0 means never)", ErrInvalidConfig, c.MaxConnectionAge, c.MaxConnectionAgeGrace)
	}
	if c.MaxConnectionAgeGrace > 0 && c.MaxConnectionAge == 0 {
		return fmt.Errorf("max connection age grace: %w: %s follows a maximum connection age; set the age too", ErrInvalidConfig, c.MaxConnectionAgeGrace)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("max connections: %w: %d must be > 0 (0 means %d)", ErrInvalidConfig, c.MaxConnections, DefaultMaxConnections)
	}
	if c.MaxConcurrentStreams < 0 {
		return fmt.Errorf("max concurrent streams: %w: %d must be > 0 (0 means %d)", ErrInvalidConfig, c.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	}
	return nil
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	return c
}

// Server serves a node's API on one port with two front ends: connections
// whose first request is gRPC (application/grpc, protobuf) go to grpc-go's
// transport, where the API's services are registered over the same service
// core; every other connection (HTTP/1.1, and HTTP/2 with Connect,
// gRPC-Web, JSON or gRPC with JSON) goes to net/http and its handler.
// Health, reflection and Envoy's rate limit service answer on both. A
// connection stays with the front end of its first request: a client (or
// proxy) that mixes gRPC with other requests on one HTTP/2 connection
// needs ServerConfig.ConnectOnly.
//
// Both front ends serve within the bounds of one ServerConfig: header,
// body and idle timeouts, one connection cap that makes room by closing
// idle connections, HTTP/2 stream limits and pings, TLS, and a GOAWAY for
// clients that reset streams in bulk (rapid reset). Its methods are safe
// for concurrent use.
type Server struct {
	http   *http.Server
	grpc   *grpc.Server // nil: net/http serves every connection
	cfg    ServerConfig
	conns  *guard.ConnLimiter
	resets *guard.ResetStats
	log    *slog.Logger
	reg    metric.Registration

	mu    sync.Mutex
	split *guard.SplitListener // set by Serve
}

// NewServer returns a server of api, the HTTP front end's handler: NewHandler's
// h, possibly wrapped (e.g. with more pages). h's services are served on
// grpc-go too, unless cfg.ConnectOnly; h nil serves api alone, every
// connection on net/http. cfg is defaulted and validated; log may be nil
// (discard).
func NewServer(h *Handler, api http.Handler, cfg ServerConfig, log *slog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.TLS != nil && len(cfg.TLS.NextProtos) == 0 {
		cfg.TLS = cfg.TLS.Clone()
		cfg.TLS.NextProtos = []string{"h2", "http/1.1"}
	}
	s := &Server{cfg: cfg, conns: guard.NewConnLimiter(cfg.MaxConnections, log), resets: &guard.ResetStats{}, log: log}
	s.http = &http.Server{
		Handler:           guard.CloseAged(guard.BodyDeadline(api, cfg.ReadTimeout)),
		ConnContext:       guard.ConnContext,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		// ReadTimeout and WriteTimeout stay unset: they would end long
		// streams (for HTTP/1.1 a read deadline left on the connection
		// cancels the request once it passes); BodyDeadline bounds bodies
		// instead.
		ConnState: s.conns.ConnState,
		Protocols: new(http.Protocols),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cfg.MaxConcurrentStreams,
			SendPingTimeout:      http2PingAfter,
			PingTimeout:          http2PingTimeout,
			WriteByteTimeout:     http2WriteByteTimeout,
		},
		// net/http's own complaints (accept errors, broken HTTP/2 peers)
		// go to the log instead of stderr.
		ErrorLog: stdlog.New(serverErrorLog{log}, "", 0),
	}
	// One port for every protocol: HTTP/1.1 for Connect and JSON, HTTP/2
	// for gRPC. What reaches net/http is plain: TLS, if any, ends below it
	// (Serve), so an HTTP/2 connection negotiated by ALPN reaches it as
	// one with prior knowledge.
	s.http.Protocols.SetHTTP1(true)
	s.http.Protocols.SetUnencryptedHTTP2(true)
	if h != nil && !cfg.ConnectOnly {
		g, err := newGRPCServer(h, cfg)
		if err != nil {
			return nil, err
		}
		s.grpc = g
	}
	if err := s.instrument(cfg.Telemetry); err != nil {
		return nil, err
	}
	return s, nil
}

// newGRPCServer returns the gRPC front end of h: grpc-go with h's services,
// within cfg's bounds. Its calls tell the connection cap when their
// connections are busy through guard.ConnCredentials and guard's
// interceptors, which find each connection's limiter themselves.
func newGRPCServer(h *Handler, cfg ServerConfig) (*grpc.Server, error) {
	codec, err := newGRPCCodec()
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(
		grpc.ForceServerCodecV2(codec),
		// The connections come with TLS ended and their place in the
		// connection cap (Serve); these credentials hand both to the calls.
		grpc.Creds(guard.ConnCredentials{}),
		// Requests inflate (gzip) to at most this, as on connect-go
		// (boundedGzip): grpc-go stops decompressing past the limit.
		grpc.MaxRecvMsgSize(h.maxRequestBytes),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.ConnectionTimeout(cfg.ReadHeaderTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cfg.IdleTimeout,
			// 0, quotad's "never", is grpc-go's infinity too.
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
			Time:                  http2PingAfter,
			Timeout:               http2PingTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		// Health's Check and the streams (health Watch, reflection) pass
		// these; the API's own methods do the same inline (grpc.go).
		grpc.UnaryInterceptor(guard.CallsInterceptor),
		grpc.StreamInterceptor(guard.StreamsInterceptor),
		// (grpc-go shares write buffers by default: a connection holds one
		// only while it writes, so idle connections hold none.)
		// Calls run on long-lived workers whose stacks have already grown,
		// instead of a new goroutine per call growing its stack again
		// (about a tenth of a hot check's CPU). At most GOMAXPROCS run at
		// once, but a call waiting on Redis holds its worker: see
		// streamWorkers. A call finding none idle gets a goroutine of its
		// own.
		grpc.NumStreamWorkers(uint32(max(streamWorkers, 4*runtime.GOMAXPROCS(0)))),
	)
	f := grpcFront{tel: h.tel, admin: h.admin, log: h.log, maxCallBytes: min(h.maxRequestBytes, MaxCallRequestBytes)}
	g.RegisterService(f.quotaService(h.svc), nil)
	if h.rls != nil {
		g.RegisterService(f.rateLimitService(h.rls), nil)
	}
	if h.rlqs != nil {
		g.RegisterService(f.rateLimitQuotaService(h.rlqs), nil)
	}
	healthv1.RegisterHealthServer(g, grpcHealth{h: h.health})
	reflectionv1.RegisterServerReflectionServer(g, reflection.NewServerV1(reflection.ServerOptions{Services: serviceNames(h.reflected)}))
	// The v1alpha service answers what v1 answers, for older tools.
	reflectionv1alpha.RegisterServerReflectionServer(g, reflection.NewServer(reflection.ServerOptions{Services: serviceNames(h.reflected)}))
	return g, nil
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// http.ErrServerClosed then; any other error is ln's. Connections beyond
// the cap are handled as ServerConfig.MaxConnections says.
func (s *Server) Serve(ln net.Listener) error {
	limited := guard.NewLimitListener(ln, s.conns, s.resets, s.cfg.TLS, s.log)
	age := func(ln net.Listener) net.Listener {
		return guard.NewAgingListener(ln, s.cfg.MaxConnectionAge, s.cfg.MaxConnectionAgeGrace, s.log)
	}
	if s.grpc == nil {
		return s.http.Serve(age(limited))
	}
	split := guard.NewSplitListener(limited, s.cfg.ReadHeaderTimeout, s.cfg.IdleTimeout, s.log)
	s.mu.Lock()
	s.split = split
	s.mu.Unlock()
	errs := make(chan error, 2)
	go func() { errs <- s.grpc.Serve(split.GRPC()) }()
	go func() { errs <- s.http.Serve(age(split.HTTP())) }()
	for range 2 {
		// grpc-go returns nil after a stop; net/http ErrServerClosed.
		if err := <-errs; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	return http.ErrServerClosed
}

// serverErrorLog routes net/http's error log into the structured log.
// Failed TLS handshakes are the client's problem (no or a wrong client
// certificate, a port scan, a TCP probe), so they go to debug; the rest
// to warn.
type serverErrorLog struct{ log *slog.Logger }

func (l serverErrorLog) Write(p []byte) (int, error) {
	msg := string(bytes.TrimSpace(p))
	if strings.Contains(msg, "TLS handshake error") {
		l.log.Debug(msg)
	} else {
		l.log.Warn(msg)
	}
	return len(p), nil
}

// Shutdown stops accepting connections, closes idle ones and lets the
// calls in flight on both front ends finish, until ctx is done; then it
// cuts what is still open (a health Watch stream never ends by itself) and
// returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	defer s.unregister()
	if s.grpc == nil {
		return s.http.Shutdown(ctx)
	}
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	err := s.http.Shutdown(ctx)
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
		err = errors.Join(err, ctx.Err())
	}
	s.closeListener()
	return err
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	defer s.unregister()
	if s.grpc != nil {
		s.grpc.Stop()
	}
	err := s.http.Close()
	s.closeListener()
	return err
}

// closeListener closes the shared listener, which both front ends' closing
// their own listeners normally did already.
func (s *Server) closeListener() {
	s.mu.Lock()
	split := s.split
	s.mu.Unlock()
	if split != nil {
		_ = split.Close()
	}
}

// ServerStats is a snapshot of the server's connection figures.
type ServerStats struct {
	// Open is the connections open now; Evicted counts idle ones closed to
	// make room for a new one, Refused new ones closed because every
	// connection was busy.
	Open, Evicted, Refused int64
	// ResetGoAways counts HTTP/2 connections sent a GOAWAY for resetting
	// too many of their streams.
	ResetGoAways int64
}

// Stats returns the server's connection figures.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Open:         s.conns.Open(),
		Evicted:      s.conns.Evicted(),
		Refused:      s.conns.Refused(),
		ResetGoAways: s.resets.GoAways(),
	}
}

func (s *Server) instrument(t Telemetry) error {
	if t.MeterProvider == nil {
		return nil
	}
	meter := t.MeterProvider.Meter("github.com/quotad/quotad/rpc")
	open, err := meter.Int64ObservableGauge("quotad.connections.open", metric.WithUnit("{connection}"),
		metric.WithDescription("API connections open now (at most --max-connections)."))
	if err != nil {
		return fmt.Errorf("quotad.connections.open: %w", err)
	}
	evicted, err := meter.Int64ObservableCounter("quotad.connections.evicted", metric.WithUnit("{connection}"),
		metric.WithDescription("Idle API connections closed to make room for a new one at --max-connections."))
	if err != nil {
		return fmt.Errorf("quotad.connections.evicted: %w", err)
	}
	refused, err := meter.Int64ObservableCounter("quotad.connections.refused", metric.WithUnit("{connection}"),
		metric.WithDescription("New API connections closed at --max-connections because no connection was idle."))
	if err != nil {
		return fmt.Errorf("quotad.connections.refused: %w", err)
	}
	goaways, err := meter.Int64ObservableCounter("quotad.http2.reset_goaways", metric.WithUnit("{connection}"),
		metric.WithDescription("HTTP/2 connections sent a GOAWAY (ENHANCE_YOUR_CALM) for resetting too many streams."))
	if err != nil {
		return fmt.Errorf("quotad.http2.reset_goaways: %w", err)
	}
	s.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		o.ObserveInt64(open, st.Open)
		o.ObserveInt64(evicted, st.Evicted)
		o.ObserveInt64(refused, st.Refused)
		o.ObserveInt64(goaways, st.ResetGoAways)
		return nil
	}, open, evicted, refused, goaways)
	if err != nil {
		return fmt.Errorf("register server instruments: %w", err)
	}
	return nil
}

func (s *Server) unregister() {
	if s.reg != nil {
		_ = s.reg.Unregister() // fails only if already unregistered
	}
}
