package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
)

// Defaults of TransportConfig.
const (
	// DefaultMaxConcurrentStreams is net/http's HTTP/2 default.
	DefaultMaxConcurrentStreams = 250
	// maxHeaderListBytes bounds a gRPC request's headers as net/http bounds
	// an HTTP request's by default (http.DefaultMaxHeaderBytes).
	maxHeaderListBytes = 1 << 20
	// keepaliveMinTime: a gRPC client that pings more often than this is
	// told to go away (GOAWAY too_many_pings). It is the shortest interval
	// grpc-go's clients allow themselves; grpc-go's server default is 5
	// minutes, which punishes clients net/http never minded.
	keepaliveMinTime = 10 * time.Second
)

// TransportConfig bounds the connections of the API's port, beyond what
// the http.Server given to NewServer bounds for the HTTP front end. The
// zero value is the default.
type TransportConfig struct {
	// FirstRequestTimeout is how long a new connection may take to send
	// the headers of its first request, TLS handshake included; past it
	// the connection is closed. It also bounds grpc-go's connection setup.
	// 0 means DefaultFirstRequestTimeout (10 s).
	FirstRequestTimeout time.Duration
	// MaxConcurrentStreams bounds the calls in flight on one gRPC
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). 0 means
	// DefaultMaxConcurrentStreams (250).
	MaxConcurrentStreams uint32
	// IdleTimeout closes a gRPC connection (with GOAWAY) that has had no
	// call in flight for this long. 0 means never, as an http.Server
	// without IdleTimeout.
	IdleTimeout time.Duration
	// ConnectOnly serves every connection on net/http, gRPC included (on
	// connect-go, several times the CPU per call). Default false: a
	// connection whose first request is gRPC goes to grpc-go. Set it when
	// a proxy in front sends gRPC and other requests on one HTTP/2
	// connection, which grpc-go would answer 415 for the others.
	ConnectOnly bool
}

// Validate reports the first problem with c.
func (c TransportConfig) Validate() error {
	if c.FirstRequestTimeout < 0 {
		return fmt.Errorf("first request timeout: %w: %s must not be negative (0 means %s)", ErrInvalidConfig, c.FirstRequestTimeout, DefaultFirstRequestTimeout)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("idle timeout: %w: %s must not be negative (0 means never)", ErrInvalidConfig, c.IdleTimeout)
	}
	return nil
}

func (c TransportConfig) withDefaults() TransportConfig {
	if c.FirstRequestTimeout == 0 {
		c.FirstRequestTimeout = DefaultFirstRequestTimeout
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	return c
}

// Server serves a Handler on one port with two front ends: connections
// whose first request is gRPC (application/grpc, protobuf) go to grpc-go's
// transport, where the API's services are registered over the same service
// core; every other connection (HTTP/1.1, and HTTP/2 with Connect,
// gRPC-Web, JSON or gRPC with JSON) goes to net/http and the Handler.
// Health, reflection and Envoy's rate limit service answer on both. A
// connection stays with the front end of its first request: a client (or
// proxy) that mixes gRPC with other requests on one HTTP/2 connection
// needs TransportConfig.ConnectOnly.
type Server struct {
	http  *http.Server
	grpc  *grpc.Server
	cfg   TransportConfig
	h     *Handler
	mu    sync.Mutex
	split *splitListener // set by Serve
}

// NewServer returns a server of h whose HTTP front end is srv: srv.Handler
// should be h, possibly wrapped (e.g. with more pages), and srv's own
// timeouts and limits apply to its connections. If srv.TLSConfig is set,
// Serve terminates TLS with it on every connection before splitting (its
// NextProtos should offer "h2" and "http/1.1"; both are offered when it
// has none); srv then sees plain HTTP/1.1 and HTTP/2, so Serve sets
// srv.Protocols to those two.
func NewServer(h *Handler, srv *http.Server, cfg TransportConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	keep := keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout}
	codec, err := newGRPCCodec()
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(
		grpc.ForceServerCodecV2(codec),
		grpc.MaxRecvMsgSize(h.maxRequestBytes),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.ConnectionTimeout(cfg.FirstRequestTimeout),
		grpc.KeepaliveParams(keep),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		// One write buffer per connection only while it writes: idle
		// connections hold none.
		grpc.SharedWriteBuffer(true),
		// Calls run on long-lived workers whose stacks have already grown,
		// instead of a new goroutine per call growing its stack again
		// (about a tenth of a hot check's CPU). At most GOMAXPROCS run at
		// once, but a call waiting on Redis holds its worker, hence four
		// each; a call finding none idle gets a goroutine of its own.
		grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
	)
	f := grpcFront{tel: h.tel, log: h.log}
	g.RegisterService(f.quotaService(h.svc), nil)
	if h.rls != nil {
		g.RegisterService(f.rateLimitService(h.rls), nil)
	}
	healthv1.RegisterHealthServer(g, grpcHealth{h: h.health})
	refl := reflection.NewServerV1(reflection.ServerOptions{Services: serviceNames(h.reflected)})
	reflectionv1.RegisterServerReflectionServer(g, refl)
	// The v1alpha service answers what v1 answers, for older tools.
	reflectionv1alpha.RegisterServerReflectionServer(g, reflection.NewServer(reflection.ServerOptions{Services: serviceNames(h.reflected)}))
	return &Server{http: srv, grpc: g, cfg: cfg, h: h}, nil
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// http.ErrServerClosed then; any other error means ln failed.
func (s *Server) Serve(ln net.Listener) error {
	if tc := s.http.TLSConfig; tc != nil {
		if len(tc.NextProtos) == 0 {
			tc = tc.Clone()
			tc.NextProtos = []string{"h2", "http/1.1"}
		}
		ln = tls.NewListener(ln, tc)
	}
	// What reaches srv is plain: TLS, if any, ended below the split.
	s.http.Protocols = new(http.Protocols)
	s.http.Protocols.SetHTTP1(true)
	s.http.Protocols.SetUnencryptedHTTP2(true)
	if s.cfg.ConnectOnly {
		return s.http.Serve(ln)
	}
	split := newSplitListener(ln, s.cfg.FirstRequestTimeout, s.h.log)
	s.mu.Lock()
	s.split = split
	s.mu.Unlock()
	errs := make(chan error, 2)
	go func() { errs <- s.grpc.Serve(split.grpc) }()
	go func() { errs <- s.http.Serve(split.http) }()
	for range 2 {
		// grpc-go returns nil after a stop; net/http ErrServerClosed.
		if err := <-errs; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	return http.ErrServerClosed
}

// Shutdown stops accepting connections and lets the calls in flight on
// both front ends finish, until ctx is done; then it cuts what is still
// open (a health Watch stream never ends by itself) and returns ctx's
// error.
func (s *Server) Shutdown(ctx context.Context) error {
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

// Close stops both front ends at once, cutting every connection.
func (s *Server) Close() error {
	s.grpc.Stop()
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
		_ = split.close()
	}
}
