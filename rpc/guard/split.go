package guard

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// This file splits one listener's connections between the two front ends:
// a connection whose first request is gRPC goes to grpc-go's transport,
// every other connection to net/http. It is the connection-level sniff of
// cmux (github.com/soheilhy/cmux), written small for exactly this one
// decision rather than taken from cmux: cmux's HTTP/2 matcher that sends
// the SETTINGS gRPC clients wait for leaves the client's acknowledgement
// of it in the stream, which net/http's HTTP/2 server answers with a
// protocol error (soheilhy/cmux#96, unmerged since 2022), and a whole
// multiplexer would be a dependency for one decision. HPACK is x/net's.
// The decision is per connection, and gRPC clients keep to one protocol
// per connection.
//
// How a connection's first request is read is in sniff.go; how what was
// read reaches the front end, in replay.go.

// SplitListener accepts from a listener and hands each connection, once
// its first request is known, to one of two listeners: GRPC's, for a
// connection whose first request is gRPC with protobuf (HTTP/2,
// application/grpc or application/grpc+proto), HTTP's for every other.
// A connection waits for its front end to accept it: each front end must
// keep calling Accept, or close its listener. Closing both of those (or
// Close) closes the listener it accepts from. Build it with
// NewSplitListener. Safe for concurrent use.
type SplitListener struct {
	ln            net.Listener
	timeout, idle time.Duration
	log           *slog.Logger

	grpc, http *subListener
	// warns spaces the warnings about connections refused for their
	// first request's headers.
	warns warnGate

	// failed is closed when ln fails for good; err says why.
	failed chan struct{}
	err    error
}

// NewSplitListener starts accepting from ln, in a goroutine of its own,
// and owns ln from then on. timeout bounds how long a connection may take
// to show its first request's headers, its TLS handshake included: past
// it the connection is closed, after a GOAWAY for HTTP/2. An HTTP/2
// connection that opens no stream is closed (with a GOAWAY) after idle
// too, if that is sooner. Both should be positive. Until its first
// request's headers have ended, a connection holds at most 16 KiB
// (maxSniffBytes). log gets connections that fail before their first
// request, at debug level, and those refused for the size of their first
// request's headers at warn level, at most one every warnEvery (10s);
// nil discards.
func NewSplitListener(ln net.Listener, timeout, idle time.Duration, log *slog.Logger) *SplitListener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &SplitListener{ln: ln, timeout: timeout, idle: idle, log: log, failed: make(chan struct{})}
	s.grpc = &subListener{parent: s, conns: make(chan net.Conn), closed: make(chan struct{})}
	s.http = &subListener{parent: s, conns: make(chan net.Conn), closed: make(chan struct{})}
	go s.accept()
	return s
}

// accept hands every connection ln accepts to route, retrying temporary
// errors as net/http does.
func (s *SplitListener) accept() {
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			// Temporary is deprecated, but it is still net/http's test for
			// an accept error worth retrying (EMFILE, ECONNABORTED).
			//lint:ignore SA1019 net/http's Server.Serve makes the same test.
			if ne, ok := err.(net.Error); ok && ne.Temporary() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Debug("accept failed; retrying", "err", err, "in", delay)
				time.Sleep(delay)
				continue
			}
			s.err = err
			close(s.failed)
			return
		}
		delay = 0
		go s.route(c)
	}
}

// route reads c up to its first request and hands it to the listener of
// its protocol, or closes it.
func (s *SplitListener) route(c net.Conn) {
	// One deadline for the TLS handshake (a tls.Conn shakes hands on its
	// first Read), the client's preface and its first request's headers
	// (HTTP/1 or HTTP/2), and for writing the splitter's SETTINGS; sniff
	// closes an HTTP/2 connection with no stream sooner if the idle
	// timeout is shorter.
	deadline := time.Now().Add(s.timeout)
	_ = c.SetDeadline(deadline)
	isGRPC, replay, err := sniff(c, deadline, s.idle)
	if err != nil {
		if errors.Is(err, errSniffTooLarge) {
			// A client may mean well: say so where operators look, but
			// once in a while, not per connection.
			if s.warns.open() {
				s.log.Warn("http2: connection refused before its first request", "remote", c.RemoteAddr().String(), "err", err)
			}
		}
		s.log.Debug("connection closed before its first request", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	to := s.http
	if isGRPC {
		to = s.grpc
	}
	to.deliver(replay)
}

// GRPC returns the listener of the connections whose first request is
// gRPC with protobuf, for grpc-go's Serve; the same one on every call.
// Its Accept returns net.ErrClosed once it is closed, and the shared
// listener's error if that fails.
func (s *SplitListener) GRPC() net.Listener { return s.grpc }

// HTTP returns the listener of every other connection, for net/http's
// Serve; the same one on every call, closed as GRPC's is.
func (s *SplitListener) HTTP() net.Listener { return s.http }

// Close closes both listeners, and so the shared one; Accept on both
// fails from then on. Connections already handed on stay open. Calling it
// again returns nil.
func (s *SplitListener) Close() error {
	s.grpc.Close()
	return s.http.Close()
}

// subListener is one front end's share of a SplitListener.
type subListener struct {
	parent    *SplitListener
	conns     chan net.Conn
	closeOnce sync.Once
	closed    chan struct{}
}

var _ net.Listener = (*subListener)(nil)

// deliver waits until the front end accepts c, or closes c if the listener
// closes first.
func (l *subListener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

// Accept implements net.Listener.
func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.parent.failed:
		return nil, l.parent.err
	}
}

// Close implements net.Listener. When both front ends' listeners are
// closed, the listener they share is too. Closing twice is not an error.
func (l *subListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	p := l.parent
	select {
	case <-p.grpc.closed:
	default:
		return nil
	}
	select {
	case <-p.http.closed:
	default:
		return nil
	}
	if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Addr implements net.Listener: the shared listener's address.
func (l *subListener) Addr() net.Addr { return l.parent.ln.Addr() }
