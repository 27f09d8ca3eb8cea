package rpc

import (
	"container/list"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// connLimiter caps the server's open connections. At the cap a new
// connection takes the slot of the connection idle for the longest (one
// with no request in flight, or that has sent none yet), which is closed:
// idle connections cost the server memory and a file descriptor while
// serving nobody, so holding many of them must not lock out a client with
// a request to make. When every connection is busy the new one is closed
// at once, so a flood of connections never exhausts file descriptors.
//
// It learns which connections are idle from http.Server's ConnState hook.
// Safe for concurrent use.
type connLimiter struct {
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

func newConnLimiter(max int, log *slog.Logger) *connLimiter {
	return &connLimiter{max: max, log: log}
}

// limitListener accepts connections for the server within its limiter.
type limitListener struct {
	net.Listener
	lim    *connLimiter
	resets *resetStats
	log    *slog.Logger
}

// Accept returns the next connection admitted by the limiter; connections
// it refuses are closed here and never reach the server.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &serverConn{Conn: raw, lim: l.lim, guard: newResetGuard(l.resets, l.log)}
		if l.lim.admit(c) {
			return c, nil
		}
		_ = raw.Close()
	}
}

// admit takes a slot for c, closing the longest idle connection to free
// one at the cap. It reports false when every connection is busy.
func (l *connLimiter) admit(c *serverConn) bool {
	l.mu.Lock()
	var victim *serverConn
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
		victim = l.idle.Remove(front).(*serverConn)
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

// connState is the server's ConnState hook: it keeps the idle list.
func (l *connLimiter) connState(nc net.Conn, state http.ConnState) {
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
func (l *connLimiter) release(c *serverConn) {
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

func (l *connLimiter) openNow() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.open)
}

// warn logs msg at most once every capWarnEvery, with the counts so far.
func (l *connLimiter) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := l.lastWarn.Load()
	if now-last < int64(capWarnEvery) || !l.lastWarn.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn(msg, append(args, "evicted_total", l.evicted.Load(), "refused_total", l.refused.Load())...)
}

// asServerConn finds the serverConn under nc: nc itself, or the connection
// a TLS connection runs on.
func asServerConn(nc net.Conn) *serverConn {
	for nc != nil {
		switch c := nc.(type) {
		case *serverConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// serverConn is an accepted connection: its slot in the limiter and its
// HTTP/2 reset guard.
type serverConn struct {
	net.Conn
	lim *connLimiter
	// elem is c's place in lim.idle while idle; released says c no longer
	// holds a slot. Both are guarded by lim.mu, as is idleSince.
	elem      *list.Element
	released  bool
	idleSince time.Time

	guard *resetGuard
}

// Close frees c's slot and closes the connection.
func (c *serverConn) Close() error {
	c.lim.release(c)
	return c.Conn.Close()
}

// Read passes the client's bytes to the server through the reset guard.
func (c *serverConn) Read(p []byte) (int, error) { return c.guard.read(c.Conn, p) }

// Write passes the server's bytes to the client through the reset guard,
// which may slip a GOAWAY in between two frames.
func (c *serverConn) Write(p []byte) (int, error) { return c.guard.write(c.Conn, p) }
