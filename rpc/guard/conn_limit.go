package guard

import (
	"container/list"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
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
// end (ServerConn.Begin and End). It sees the connections of the
// LimitListeners built on it; the zero value is not usable (see
// NewConnLimiter). Safe for concurrent use; no method waits for anything
// but the limiter's own short lock.
type ConnLimiter struct {
	max int
	log *slog.Logger

	mu   sync.Mutex
	open int
	// idle holds the idle connections, the longest idle first.
	idle list.List

	evicted, refused atomic.Int64
	// warns spaces the warnings about the cap.
	warns warnGate
}

// NewConnLimiter returns a limiter of at most max connections open at
// once; max should be positive (with max ≤ 0 every connection is refused).
// log gets a warning when the cap evicts or refuses a connection, at most
// one every warnEvery (10s), with the totals so far; nil discards.
func NewConnLimiter(max int, log *slog.Logger) *ConnLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ConnLimiter{max: max, log: log}
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

// ConnState is an http.Server's ConnState hook: a connection is idle for
// the cap while net/http says StateIdle (and from its admission until its
// first request), busy while StateActive; an aged connection that becomes
// idle is closed (max_age.go). Connections that did not come through a
// LimitListener are ignored.
func (l *ConnLimiter) ConnState(nc net.Conn, state http.ConnState) {
	c := asServerConn(nc)
	if c == nil {
		return
	}
	l.mu.Lock()
	closeNow := false
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
		closeNow = c.closeIdle
	case http.StateHijacked, http.StateClosed:
		if c.elem != nil {
			l.idle.Remove(c.elem)
			c.elem = nil
		}
	}
	l.mu.Unlock()
	if closeNow {
		// An aged connection's last request has ended (max_age.go).
		c.closeWhenStillIdle()
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

// Open returns the connections holding a slot now, at most the cap.
func (l *ConnLimiter) Open() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.open)
}

// Idle returns how many of the open connections are idle now (no request
// in flight, or none sent yet): those the cap may close to make room.
func (l *ConnLimiter) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Evicted returns how many idle connections the cap has closed to make
// room for a new one, since NewConnLimiter.
func (l *ConnLimiter) Evicted() int64 { return l.evicted.Load() }

// Refused returns how many new connections the cap has closed at once
// because every open connection was busy, since NewConnLimiter.
func (l *ConnLimiter) Refused() int64 { return l.refused.Load() }

// warn logs msg at most once every warnEvery, with the counts so far.
func (l *ConnLimiter) warn(msg string, args ...any) {
	if !l.warns.open() {
		return
	}
	l.log.Warn(msg, append(args, "evicted_total", l.evicted.Load(), "refused_total", l.refused.Load())...)
}

// Begin marks a call (a gRPC stream) in flight on c: c is busy, and the
// cap will not close it, until End has been called as many times. Only
// the gRPC front end calls it; net/http's connections are followed by
// ConnState. c may be nil (a no-op, as CallConn returns for a call of
// unknown connection). Safe for concurrent use; it does not block.
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

// End ends a call begun on c; with none left c is idle from now. Each End
// must follow one Begin. c may be nil (a no-op).
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

// ServerConn is a connection a LimitListener accepted, and its slot in
// the ConnLimiter. The connections a LimitListener returns run on one
// (under TLS, the reset guard and the split's replay); CallConn finds it
// for a gRPC call. Its Read and Write are the connection's.
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
	// closeIdle says c, past its maximum age (max_age.go), closes once
	// idle; stopAging stops its aging timers, nil without any. Guarded by
	// lim.mu.
	closeIdle bool
	stopAging func()
	// aged says c is past its maximum age: an HTTP/1.1 response on it
	// closes it.
	aged atomic.Bool
}

// Close frees c's slot (once, however often it is called), stops its
// aging timers and closes the connection.
func (c *ServerConn) Close() error {
	c.lim.mu.Lock()
	stop := c.stopAging
	c.stopAging = nil
	c.lim.mu.Unlock()
	if stop != nil {
		stop()
	}
	c.lim.release(c)
	return c.Conn.Close()
}
