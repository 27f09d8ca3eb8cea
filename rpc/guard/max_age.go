package guard

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// This file ages out the HTTP front end's connections, as grpc-go's
// keepalive.ServerParameters MaxConnectionAge and MaxConnectionAgeGrace
// age out the gRPC front end's: a connection older than its age (±10%,
// so that connections opened together do not all go at once) is asked to
// go, and those behind a load balancer spread over new backends. An
// HTTP/2 connection gets a GOAWAY that lets every stream it has opened
// finish and allows no new one (RFC 9113 §6.8, what a graceful shutdown
// sends first), and closes once its requests have ended; an HTTP/1.1
// connection's next response carries "Connection: close". Past the grace
// after its age a connection is closed, whatever is in flight on it.
// net/http has no GOAWAY for one connection, so the reset guard, which
// already reads the connection's frames, slips it in between two frames
// of the server's output (h2_resets.go).

// agedDrain is how long an aged HTTP/2 connection stays open, idle, after
// its GOAWAY: a request the client sent before reading it still arrives
// and is answered, rather than finding the connection closed.
const agedDrain = time.Second

// agingListener starts each connection it accepts aging.
type agingListener struct {
	net.Listener
	age, grace time.Duration
	log        *slog.Logger
}

// NewAgingListener returns ln, whose connections came from a
// LimitListener (others are passed on unaged), with each one asked to go
// at age (±10%) and closed at age+grace: grace 0 waits for its requests
// however long they take, as grpc-go's does. age 0 returns ln itself. The
// server must call ConnLimiter.ConnState and wrap its handler in
// CloseAged, with its ConnContext, for the HTTP/1.1 side. log gets a
// debug line per connection aged out; nil discards.
func NewAgingListener(ln net.Listener, age, grace time.Duration, log *slog.Logger) net.Listener {
	if age <= 0 {
		return ln
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &agingListener{Listener: ln, age: age, grace: grace, log: log}
}

// Accept returns the next connection with its aging timer started.
func (l *agingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := asServerConn(c)
	if sc == nil {
		return c, nil
	}
	// As grpc-go: the age plus or minus up to a tenth of it.
	age := l.age + time.Duration((rand.Float64()*0.2-0.1)*float64(l.age))
	var timers []*time.Timer
	timers = append(timers, time.AfterFunc(age, func() { l.ageOut(c, sc) }))
	if l.grace > 0 {
		timers = append(timers, time.AfterFunc(age+l.grace, func() {
			l.log.Debug("connection closed: past its maximum age and grace", "remote", c.RemoteAddr().String())
			_ = sc.Close()
		}))
	}
	sc.lim.mu.Lock()
	if sc.released {
		// Closed already (evicted by the cap, or gone).
		sc.lim.mu.Unlock()
		for _, t := range timers {
			t.Stop()
		}
		return c, nil
	}
	sc.stopAging = func() {
		for _, t := range timers {
			t.Stop()
		}
	}
	sc.lim.mu.Unlock()
	return c, nil
}

// ageOut asks c to go: a GOAWAY for HTTP/2, which closes it once idle
// after agedDrain; "Connection: close" on the next HTTP/1.1 response.
func (l *agingListener) ageOut(c net.Conn, sc *ServerConn) {
	sc.aged.Store(true)
	g := asGuardedConn(c)
	if g == nil || !g.guard.h2.Load() {
		l.log.Debug("connection past its maximum age: its next response closes it", "remote", c.RemoteAddr().String())
		return
	}
	g.guard.queueGoAway(g.Conn, goAwayFrame(h2MaxStreamID, h2NoError, "max connection age"), false)
	l.log.Debug("connection past its maximum age: sent GOAWAY", "remote", c.RemoteAddr().String())
	sc.lim.mu.Lock()
	sc.closeIdle = true
	sc.lim.mu.Unlock()
	sc.closeWhenStillIdle()
}

// closeWhenStillIdle closes c, an aged connection, agedDrain from now if
// it is idle then: a client may still send what it sent before it read
// the GOAWAY, and net/http may still be writing out the end of the last
// response (its idle state comes before its buffer is flushed). A
// connection busy then is closed when it next becomes idle
// (ConnLimiter.ConnState).
func (c *ServerConn) closeWhenStillIdle() {
	time.AfterFunc(agedDrain, func() {
		c.lim.mu.Lock()
		idle := c.elem != nil && c.calls == 0
		c.lim.mu.Unlock()
		if idle {
			_ = c.Close()
		}
	})
}

// asGuardedConn finds the reset guard's connection under nc, or nil.
func asGuardedConn(nc net.Conn) *guardedConn {
	for nc != nil {
		switch c := nc.(type) {
		case *guardedConn:
			return c
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// serverConnKey is the context key of a request's ServerConn.
type serverConnKey struct{}

// ConnContext is an http.Server's ConnContext hook: it keeps the request's
// connection where CloseAged finds it.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if sc := asServerConn(c); sc != nil {
		return context.WithValue(ctx, serverConnKey{}, sc)
	}
	return ctx
}

// CloseAged is h, answering a request on an aged HTTP/1.1 connection with
// "Connection: close", so that net/http closes it after the response and
// the client's next request opens a new one. HTTP/2 requests are left to
// the GOAWAY (the header is not HTTP/2's).
func CloseAged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sc, ok := r.Context().Value(serverConnKey{}).(*ServerConn); ok && r.ProtoMajor == 1 && sc.aged.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
