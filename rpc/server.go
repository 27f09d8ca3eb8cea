package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"
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

// ServerConfig bounds what clients can hold of the API's HTTP server:
// time, connections and HTTP/2 streams. The zero value is the default.
// Build it with defaults, apply overrides, then Validate (NewServer does).
type ServerConfig struct {
	// ReadHeaderTimeout is how long a connection may take to send a
	// request's headers (HTTP/1.1), or its HTTP/2 preface, once it starts
	// one. 0 means DefaultReadHeaderTimeout (10s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout is how long a request's body may take to arrive, from
	// its headers to its last byte; a body still arriving then fails the
	// request (HTTP/1.1 then closes the connection). It does not apply to
	// the response, so server streams (a health Watch, whose request ends
	// at once) last as long as the client wants; a stream whose client
	// keeps its own side open (gRPC reflection) is cut after it. 0 means
	// DefaultReadTimeout (30s).
	ReadTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight for this
	// long: an HTTP/1.1 keep-alive connection between requests, an HTTP/2
	// connection with no open stream (with a GOAWAY). 0 means
	// DefaultIdleTimeout (2m).
	IdleTimeout time.Duration
	// MaxConnections bounds the connections open at once. A connection
	// that arrives at the bound takes the place of the one idle for the
	// longest (no request in flight, or none sent yet), which is closed;
	// when every connection is busy it is closed at once instead. 0 means
	// DefaultMaxConnections (10,000).
	MaxConnections int
	// MaxConcurrentStreams bounds the streams (requests) one HTTP/2
	// connection may have open. 0 means DefaultMaxConcurrentStreams (250).
	MaxConcurrentStreams int
	// Telemetry: with a MeterProvider the server reports its connections
	// and GOAWAYs (docs/observability.md).
	Telemetry Telemetry
	// TLS, when set, makes the server serve TLS only: HTTP/2 by ALPN and
	// HTTP/1.1, no h2c. Its certificates come from it (Certificates,
	// GetCertificate or GetConfigForClient). nil serves cleartext.
	TLS *tls.Config
	// ErrorLog receives net/http's own complaints (accept errors, failed
	// TLS handshakes, broken HTTP/2 peers). nil logs them to the server's
	// logger at warn.
	ErrorLog *log.Logger
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

// Server serves an http.Handler (NewHandler's) on one port for HTTP/1.1
// and cleartext HTTP/2 (h2c), or with ServerConfig.TLS for TLS only, within the bounds of a ServerConfig: header,
// body and idle timeouts, a connection cap that makes room by closing idle
// connections, HTTP/2 stream limits, and a GOAWAY for clients that reset
// streams in bulk (rapid reset). Its methods are safe for concurrent use.
type Server struct {
	http   *http.Server
	conns  *connLimiter
	resets *resetStats
	log    *slog.Logger
	reg    metric.Registration
}

// NewServer returns a server for h. cfg is defaulted and validated; logger
// may be nil (discard).
func NewServer(h http.Handler, cfg ServerConfig, logger *slog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{conns: newConnLimiter(cfg.MaxConnections, logger), resets: &resetStats{}, log: logger}
	s.http = &http.Server{
		Handler:           bodyDeadline(h, cfg.ReadTimeout),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		// ReadTimeout and WriteTimeout stay unset: they would end long
		// streams (for HTTP/1.1 a read deadline left on the connection
		// cancels the request once it passes); bodyDeadline bounds bodies
		// instead.
		ConnState: s.conns.connState,
		Protocols: new(http.Protocols),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cfg.MaxConcurrentStreams,
			SendPingTimeout:      http2PingAfter,
			PingTimeout:          http2PingTimeout,
			WriteByteTimeout:     http2WriteByteTimeout,
		},
		// net/http's own complaints (accept errors, broken HTTP/2 peers) go
		// to the log instead of stderr.
		ErrorLog: cfg.ErrorLog,
	}
	if s.http.ErrorLog == nil {
		s.http.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	}
	// One port for every protocol: HTTP/1.1 for Connect and JSON, cleartext
	// HTTP/2 (h2c) for gRPC.
	s.http.Protocols.SetHTTP1(true)
	s.http.Protocols.SetUnencryptedHTTP2(true)
	if cfg.TLS != nil {
		// Over TLS, HTTP/2 is negotiated by ALPN; nothing speaks h2c.
		s.http.TLSConfig = cfg.TLS
		s.http.Protocols.SetHTTP2(true)
		s.http.Protocols.SetUnencryptedHTTP2(false)
	}
	if err := s.instrument(cfg.Telemetry); err != nil {
		return nil, err
	}
	return s, nil
}

// Serve accepts connections on ln until Shutdown or Close, and returns
// http.ErrServerClosed then; any other error is ln's. Connections beyond
// the cap are handled as ServerConfig.MaxConnections says.
func (s *Server) Serve(ln net.Listener) error {
	limited := &limitListener{Listener: ln, lim: s.conns, resets: s.resets, log: s.log}
	if s.http.TLSConfig != nil {
		// The certificate comes from ServerConfig.TLS.
		return s.http.ServeTLS(limited, "", "")
	}
	return s.http.Serve(limited)
}

// Shutdown stops accepting, closes idle connections and waits for
// requests in flight until ctx ends (http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error {
	defer s.unregister()
	return s.http.Shutdown(ctx)
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	defer s.unregister()
	return s.http.Close()
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
		Open:         s.conns.openNow(),
		Evicted:      s.conns.evicted.Load(),
		Refused:      s.conns.refused.Load(),
		ResetGoAways: s.resets.goaways.Load(),
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

// bodyDeadline gives every request body d to arrive, from the moment its
// handler starts to the body's end, through the connection's read deadline
// (HTTP/1.1) or the stream's (HTTP/2). The deadline is lifted once the body
// has been read to its end, so a response may stream for as long as it
// likes. Requests without a body are left alone. A body that misses the
// deadline fails its request with an error wrapping
// os.ErrDeadlineExceeded (DeadlineExceeded), and an HTTP/1.1 connection
// is closed after the response: what is left of the body would otherwise
// be read as the next request.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			// Only a ResponseWriter that supports no deadline fails here,
			// which net/http's do not.
			next.ServeHTTP(w, r)
			return
		}
		// A shallow copy carries the wrapped body: net/http keeps judging
		// the original (an HTTP/1.1 body left unread past its limit closes
		// the connection rather than be read as the next request).
		wrapped := *r
		wrapped.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, timeout: d, w: w, http1: r.ProtoMajor == 1}
		next.ServeHTTP(w, &wrapped)
	})
}

// deadlineBody lifts its request's read deadline when the body ends, and
// explains the error when the deadline passes first.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	w       http.ResponseWriter
	http1   bool
	lifted  bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		if !b.lifted {
			b.lifted = true
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		if b.http1 {
			// Set before the handler answers, so net/http closes the
			// connection after the response.
			b.w.Header().Set("Connection", "close")
		}
		err = fmt.Errorf("request body not received within the read timeout (%s): %w", b.timeout, err)
	}
	return n, err
}
