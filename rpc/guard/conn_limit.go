package guard

import (
	"container/list"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ConnLimiter caps the server's open connections. At the cap a new
// connection takes the slot of the connection idle for the longest (one
// with no request in flight, or that has sent none yet), which is closed:
// idle connections cost the server memory and a file descriptor while
// serving nobody, so holding many of them must not lock out a client with
// a request to make. When every connection is busy the new one is closed
// at once, so a flood of connections never exhausts file descriptors.
//
// It learns which connections are idle from http.Server's ConnState hook
// on the HTTP front end, and from the calls themselves on the gRPC front
// end (ServerConn.Begin and End). Safe for concurrent use.
type ConnLimiter struct {
	max int
	log *slog.Logger

	mu   sync.Mutex
	open int
	// idle holds the idle connections, the longest idle first.
	idle list.List

	evicted, refused atomic.Int64
	// lastWarn is the unix nanoseconds of the last warning about the cap,
	// so that a flood is logged once every capWarnEvery, not per
	// connection.
	lastWarn atomic.Int64
}

// capWarnEvery spaces the log lines about connections evicted or refused
// at the cap.
const capWarnEvery = 10 * time.Second

func NewConnLimiter(max int, log *slog.Logger) *ConnLimiter {
	return &ConnLimiter{max: max, log: log}
}

// LimitListener accepts connections for the server within its limiter,
// ends TLS on them when tls is set, and guards them against rapid reset.
type LimitListener struct {
	net.Listener
	lim    *ConnLimiter
	resets *ResetStats
	log    *slog.Logger
	tls    *tls.Config // nil: cleartext
}

// NewLimitListener returns ln's connections admitted by lim, with TLS
// ended when tlsConf is set, guarded against rapid reset (counted in
// resets).
func NewLimitListener(ln net.Listener, lim *ConnLimiter, resets *ResetStats, tlsConf *tls.Config, log *slog.Logger) *LimitListener {
	return &LimitListener{Listener: ln, lim: lim, resets: resets, log: log, tls: tlsConf}
}

// Accept returns the next connection admitted by the limiter; connections
// it refuses are closed here and never reach the server. A TLS connection
// shakes hands on its first Read, under the deadline its reader sets.
func (l *LimitListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &ServerConn{Conn: raw, lim: l.lim}
		if !l.lim.admit(c) {
			_ = raw.Close()
			continue
		}
		var plain net.Conn = c
		if l.tls != nil {
			plain = tls.Server(c, l.tls)
		}
		// Above TLS, so that the guard reads HTTP/2 frames, not ciphertext.
		return &guardedConn{Conn: plain, guard: newResetGuard(l.resets, l.log)}, nil
	}
}

// admit takes a slot for c, closing the longest idle connection to free
// one at the cap. It reports false when every connection is busy.
func (l *ConnLimiter) admit(c *ServerConn) bool {
	l.mu.Lock()
	var victim *ServerConn
	if l.open >= l.max {
		front := l.idle.Front()
		if front == nil {
			l.mu.Unlock()
			l.refused.Add(1)
			l.warn("connection cap reached and every connection busy: new connection closed", "max_connections", l.max)
			return false
		}
		// The victim's slot passes to c: the count stays at the cap, and
		// the victim's own Close frees nothing.
		victim = l.idle.Remove(front).(*ServerConn)
		victim.elem, victim.released = nil, true
	} else {
		l.open++
	}
	c.idleSince = time.Now()
	c.elem = l.idle.PushBack(c)
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		l.warn("connection cap reached: closed the longest idle connection to make room", "max_connections", l.max, "idle_for", time.Since(victim.idleSince).Round(time.Millisecond))
		_ = victim.Conn.Close()
	}
	return true
}

// ConnState is the server's ConnState hook: it keeps the idle list.
func (l *ConnLimiter) ConnState(nc net.Conn, state http.ConnState) {
	c := asServerConn(nc)
	if c == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateActive:
		if c.elem != nil {
			l.idle.Remove(c.elem)
			c.elem = nil
		}
	case http.StateIdle:
		if c.elem == nil && !c.released {
			c.idleSince = time.Now()
			c.elem = l.idle.PushBack(c)
		}
	case http.StateHijacked, http.StateClosed:
		if c.elem != nil {
			l.idle.Remove(c.elem)
			c.elem = nil
		}
	}
}

// release frees c's slot, once.
func (l *ConnLimiter) release(c *ServerConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
	if !c.released {
		c.released = true
		l.open--
	}
}

// Open returns the connections open now.
func (l *ConnLimiter) Open() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.open)
}

// Idle returns the connections idle now.
func (l *ConnLimiter) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Evicted returns how many idle connections were closed to make room.
func (l *ConnLimiter) Evicted() int64 { return l.evicted.Load() }

// Refused returns how many new connections were closed with every
// connection busy.
func (l *ConnLimiter) Refused() int64 { return l.refused.Load() }

// warn logs msg at most once every capWarnEvery, with the counts so far.
func (l *ConnLimiter) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := l.lastWarn.Load()
	if now-last < int64(capWarnEvery) || !l.lastWarn.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn(msg, append(args, "evicted_total", l.evicted.Load(), "refused_total", l.refused.Load())...)
}

// Begin marks a call (a gRPC stream) in flight on c: c is busy until as
// many calls of End. Only the gRPC front end calls it; net/http's
// connections are followed by ConnState. c may be nil (a no-op).
func (c *ServerConn) Begin() {
	if c == nil {
		return
	}
	l := c.lim
	l.mu.Lock()
	c.calls++
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
	l.mu.Unlock()
}

// End ends a call begun on c; with none left c is idle from now.
func (c *ServerConn) End() {
	if c == nil {
		return
	}
	l := c.lim
	l.mu.Lock()
	c.calls--
	if c.calls == 0 && c.elem == nil && !c.released {
		c.idleSince = time.Now()
		c.elem = l.idle.PushBack(c)
	}
	l.mu.Unlock()
}

// asServerConn finds the ServerConn under nc: nc itself, or the connection
// a wrapper (TLS, the reset guard, the front-end split) runs on.
func asServerConn(nc net.Conn) *ServerConn {
	for nc != nil {
		switch c := nc.(type) {
		case *ServerConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// ServerConn is an accepted connection and its slot in the limiter.
type ServerConn struct {
	net.Conn
	lim *ConnLimiter
	// elem is c's place in lim.idle while idle; released says c no longer
	// holds a slot; calls counts the gRPC calls in flight on c. All are
	// guarded by lim.mu, as is idleSince.
	elem      *list.Element
	released  bool
	calls     int
	idleSince time.Time
}

// Close frees c's slot and closes the connection.
func (c *ServerConn) Close() error {
	c.lim.release(c)
	return c.Conn.Close()
}

// guardedConn is a connection (cleartext, or TLS ended) whose HTTP/2
// frames pass its reset guard.
type guardedConn struct {
	net.Conn
	guard *resetGuard
}

// Read passes the client's bytes to the server through the reset guard.
func (c *guardedConn) Read(p []byte) (int, error) { return c.guard.read(c.Conn, p) }

// Write passes the server's bytes to the client through the reset guard,
// which may slip a GOAWAY in between two frames.
func (c *guardedConn) Write(p []byte) (int, error) { return c.guard.write(c.Conn, p) }

// NetConn returns the connection under the guard.
func (c *guardedConn) NetConn() net.Conn { return c.Conn }

// ConnCredentials are the gRPC front end's transport credentials: no
// handshake (TLS, if any, ended below the split), only an AuthInfo that
// carries the connection's ServerConn, for its calls to keep the
// connection cap's idle list, and its TLS state, for a call to see who
// its client is (peer.FromContext), as grpc-go's own TLS credentials give.
type ConnCredentials struct{}

var _ credentials.TransportCredentials = ConnCredentials{}

// connInfo is ConnCredentials' AuthInfo.
type connInfo struct {
	credentials.TLSInfo // zero without TLS
	conn                *ServerConn
}

// AuthType implements credentials.AuthInfo.
func (i connInfo) AuthType() string {
	if i.State.Version == 0 {
		return "insecure"
	}
	return i.TLSInfo.AuthType()
}

// ServerHandshake implements credentials.TransportCredentials.
func (ConnCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := connInfo{conn: asServerConn(c)}
	info.SecurityLevel = credentials.NoSecurity
	for nc := c; nc != nil; {
		if tc, ok := nc.(*tls.Conn); ok {
			info.State = tc.ConnectionState()
			info.SecurityLevel = credentials.PrivacyAndIntegrity
			break
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = u.NetConn()
	}
	return c, info, nil
}

// ClientHandshake implements credentials.TransportCredentials; the server
// never calls it.
func (ConnCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, connInfo{}, nil
}

// Info implements credentials.TransportCredentials.
func (ConnCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "quotad"}
}

// Clone implements credentials.TransportCredentials.
func (ConnCredentials) Clone() credentials.TransportCredentials { return ConnCredentials{} }

// OverrideServerName implements credentials.TransportCredentials.
func (ConnCredentials) OverrideServerName(string) error { return nil }

// CallConn returns the ServerConn a gRPC call came on; nil if unknown.
func CallConn(ctx context.Context) *ServerConn {
	if p, ok := peer.FromContext(ctx); ok {
		if i, ok := p.AuthInfo.(connInfo); ok {
			return i.conn
		}
	}
	return nil
}

// CallsInterceptor keeps a unary call's connection busy while it runs,
// for the gRPC services the front end does not write itself (health).
func CallsInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	c := CallConn(ctx)
	c.Begin()
	defer c.End()
	return next(ctx, req)
}

// StreamsInterceptor keeps a stream's connection busy while it is open
// (a health Watch, reflection).
func StreamsInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	c := CallConn(ss.Context())
	c.Begin()
	defer c.End()
	return next(srv, ss)
}
