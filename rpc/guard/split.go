package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
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
// An HTTP/2 connection opens with the client's preface and SETTINGS; the
// content-type of its first request is in the first HEADERS frame after
// them. grpc-go clients send nothing more before the server's SETTINGS
// arrive, so the splitter sends an empty SETTINGS frame itself, reads up to
// the first request's headers, and hands the connection on with everything
// it read replayed in front, except the client's acknowledgement of that
// frame, which the real server never asked for (net/http's HTTP/2 server
// hangs up on an unexpected one): dropped where the splitter reads it, or,
// when the client sends it after its first request, by the connection
// handed on (ackDropper).
//
// What the splitter holds of a connection is bounded in bytes and in time,
// since it holds it before any server's own bounds apply: at most
// maxSniffBytes (16 KiB), in one buffer that is the replay itself, and
// only until the read-header timeout from the connection's start, by when
// the first request's headers must have ended. A connection past either
// bound gets a GOAWAY saying which, and is closed. An HTTP/2 connection
// that opens no stream is idle as net/http sees it: after the idle timeout,
// if that is sooner, the splitter sends it a GOAWAY and closes it, as
// net/http would.

const (
	// http2Preface is what every HTTP/2 client sends first.
	http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// maxSniffBytes bounds what the splitter holds of one HTTP/2
	// connection before it knows the connection's front end: the preface,
	// the frames before the first request, and that request's header
	// block. A first request's headers are rarely over a kilobyte or two
	// (a large bearer token and trace context included); the bound keeps
	// a connection that never finishes them to 16 KiB, where it used to
	// hold up to 1 MiB twice over (RSS grew by 3.8 MB per connection).
	maxSniffBytes = 16 << 10
	// maxFrameSize is the largest frame a client may send before the server
	// allows more: the HTTP/2 default, which the splitter's empty SETTINGS
	// leaves in force.
	maxFrameSize = 1 << 14
)

// HTTP/2 frame types and flags the splitter reads (RFC 9113, section 6).
const (
	frameHeaders      = 0x1
	frameSettings     = 0x4
	frameContinuation = 0x9
	flagAck           = 0x1
	flagEndHeaders    = 0x4
	flagPadded        = 0x8
	flagPriority      = 0x20
)

// emptySettings is a SETTINGS frame with no parameters, on stream 0.
var emptySettings = [9]byte{0, 0, 0, frameSettings, 0, 0, 0, 0, 0}

// SplitListener accepts from ln and hands each connection, once its first
// request is known, to the gRPC or the HTTP listener. Closing both of
// those closes ln. Safe for concurrent use.
type SplitListener struct {
	ln            net.Listener
	timeout, idle time.Duration
	log           *slog.Logger

	grpc, http *subListener
	// lastWarn is the unix nanoseconds of the last warning about a
	// connection refused for its first request's headers.
	lastWarn atomic.Int64

	// failed is closed when ln fails for good; err says why.
	failed chan struct{}
	err    error
}

// NewSplitListener starts accepting from ln. timeout bounds how long a
// connection may take to show its first request's headers, its TLS
// handshake included: past it the connection is closed, after a GOAWAY
// for HTTP/2. An HTTP/2 connection that opens no stream is closed (with a
// GOAWAY) after idle too, if that is sooner. log gets connections that
// fail before their first request, at debug level, and those refused for
// the size of their first request's headers at warn level, at most one
// every capWarnEvery.
func NewSplitListener(ln net.Listener, timeout, idle time.Duration, log *slog.Logger) *SplitListener {
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
			now := time.Now().UnixNano()
			if last := s.lastWarn.Load(); now-last >= int64(capWarnEvery) && s.lastWarn.CompareAndSwap(last, now) {
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
// gRPC.
func (s *SplitListener) GRPC() net.Listener { return s.grpc }

// HTTP returns the listener of every other connection.
func (s *SplitListener) HTTP() net.Listener { return s.http }

// Close closes ln (once); Accept on both listeners fails from then on.
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

// replayConn is a connection whose first bytes, already read by the
// splitter, are read again before the rest; with ack set, the rest passes
// it until it has dropped the client's SETTINGS acknowledgement. Like any
// net.Conn it is read by one goroutine at a time.
type replayConn struct {
	net.Conn
	pending []byte
	ack     *ackDropper // nil: nothing to drop
}

// NetConn returns the connection replayed.
func (c *replayConn) NetConn() net.Conn { return c.Conn }

func (c *replayConn) Read(p []byte) (int, error) {
	if c.ack != nil {
		return c.readDropping(p)
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil // let the buffer go
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// readDropping reads through c.ack until it has dropped the acknowledgement
// and handed on all it held.
func (c *replayConn) readDropping(p []byte) (int, error) {
	for len(c.ack.out) == 0 {
		if c.ack.dropped {
			c.ack = nil
			return c.Read(p)
		}
		buf := make([]byte, max(len(p), 512))
		n, err := c.Conn.Read(buf)
		if n == 0 {
			return 0, err
		}
		c.ack.feed(buf[:n])
	}
	n := copy(p, c.ack.out)
	c.ack.out = c.ack.out[n:]
	if len(c.ack.out) == 0 && c.ack.dropped {
		c.ack = nil
	}
	return n, nil
}

// ackDropper follows a client's HTTP/2 frames from a frame boundary and
// drops the first SETTINGS acknowledgement among them: the one of the
// splitter's SETTINGS, as a client acknowledges SETTINGS in the order it
// got them. Everything else goes to out unchanged, a frame header only
// once whole.
type ackDropper struct {
	out     []byte
	hdr     [9]byte
	hdrN    int
	left    int // payload bytes of the current frame still to pass
	dropped bool
}

// feed passes b through the dropper into out.
func (d *ackDropper) feed(b []byte) {
	for len(b) > 0 {
		if d.dropped {
			d.out = append(d.out, b...)
			return
		}
		if d.left > 0 {
			k := min(d.left, len(b))
			d.out = append(d.out, b[:k]...)
			d.left -= k
			b = b[k:]
			continue
		}
		k := copy(d.hdr[d.hdrN:], b)
		d.hdrN += k
		b = b[k:]
		if d.hdrN < len(d.hdr) {
			return
		}
		d.hdrN = 0
		length := int(d.hdr[0])<<16 | int(d.hdr[1])<<8 | int(d.hdr[2])
		if d.hdr[3] == frameSettings && d.hdr[4]&flagAck != 0 && length == 0 {
			d.dropped = true
			continue
		}
		d.out = append(d.out, d.hdr[:]...)
		d.left = length
	}
}

// sniff reads c until it knows whether c carries gRPC: an HTTP/2
// connection whose first request's content-type is application/grpc or
// application/grpc+proto (what grpc-go serves). Everything else — HTTP/1,
// and HTTP/2 with Connect, gRPC-Web, JSON or gRPC with another codec — is
// not. replay is c with what sniff read in front of the rest.
//
// sniff reads until deadline, the read-header timeout from the
// connection's start (the caller has set it on c), except that an HTTP/2 connection that opens
// no stream is idle as net/http sees it and has at most idle after its
// preface. It holds at most maxSniffBytes of c: an HTTP/2 connection whose
// first request's headers (with the frames before them) take more is sent
// a GOAWAY saying so and refused. Past the deadline, a connection with no
// stream gets a GOAWAY (NO_ERROR), as net/http sends an idle one; one in
// the middle of its first request's headers a GOAWAY naming the timeout.
// An error means c should be closed.
func sniff(c net.Conn, deadline time.Time, idle time.Duration) (isGRPC bool, replay net.Conn, err error) {
	buf := make([]byte, 0, 4096)
	for len(buf) < len(http2Preface) {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if !strings.HasPrefix(http2Preface, string(buf[:min(len(buf), len(http2Preface))])) {
			// HTTP/1 (or garbage, for net/http to refuse)
			return false, &replayConn{Conn: c, pending: buf}, nil
		}
		if err != nil {
			return false, nil, fmt.Errorf("read the HTTP/2 preface: %w", err)
		}
	}
	if _, err := c.Write(emptySettings[:]); err != nil {
		return false, nil, fmt.Errorf("write SETTINGS: %w", err)
	}
	// The read-header deadline stays for a connection that starts a
	// request; one that opens no stream is idle, and may not stay idle
	// past the idle timeout either.
	idleDeadline := time.Now().Add(idle)
	s := frameSniffer{buf: buf, at: len(http2Preface)}
	for !s.gotHeaders {
		err := s.step()
		if errors.Is(err, errNeedMore) {
			readBy := deadline
			if !s.inHeaders && idleDeadline.Before(deadline) {
				readBy = idleDeadline
			}
			_ = c.SetReadDeadline(readBy)
			err = s.read(c)
			if err != nil && !errors.Is(err, errSniffTooLarge) && !errors.Is(err, os.ErrDeadlineExceeded) {
				return false, nil, fmt.Errorf("read the first request: %w", err)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, errSniffTooLarge):
			refuse(c, h2EnhanceYourCalm, err.Error())
			return false, nil, err
		case errors.Is(err, os.ErrDeadlineExceeded) && !s.inHeaders:
			// Idle, with no stream: as net/http's HTTP/2 server would,
			// say so before closing.
			refuse(c, 0, "")
			return false, nil, fmt.Errorf("no request within the idle or read-header timeout: sent GOAWAY: %w", err)
		case errors.Is(err, os.ErrDeadlineExceeded):
			refuse(c, h2EnhanceYourCalm, errHeadersTooSlow.Error())
			return false, nil, fmt.Errorf("%w: %w", errHeadersTooSlow, err)
		default:
			return false, nil, err
		}
	}
	rc := &replayConn{Conn: c}
	if s.gotAck {
		rc.pending = s.buf
	} else {
		// The client sends its acknowledgement after its first request:
		// it is still to come, maybe among the bytes read already.
		rc.ack = &ackDropper{out: s.buf[:s.at:s.at]}
		rc.ack.feed(s.buf[s.at:])
	}
	return isGRPCContentType(s.contentType), rc, nil
}

// refuse tells an HTTP/2 client why its connection closes: a GOAWAY with
// code and debug, written within a second (a client that reads nothing
// does not hold the splitter).
func refuse(c net.Conn, code uint32, debug string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(goAwayFrame(0, code, debug))
}

var (
	errNeedMore      = errors.New("need more bytes")
	errSniffTooLarge = fmt.Errorf("the first request's headers, with the frames before them, take more than %d bytes, "+
		"the most quotad reads before it picks the connection's front end: send less on the first request, or serve with --grpc-transport=connect", maxSniffBytes)
	errHeadersTooSlow = errors.New("the first request's headers did not end within the read-header timeout (--read-header-timeout)")
)

// frameSniffer reads HTTP/2 frames after the preface until it has the
// first HEADERS frame's whole header block and its content-type, dropping
// the client's first SETTINGS acknowledgement if it comes before. It keeps
// one buffer of at most maxSniffBytes, which it hands on for replay: the
// acknowledgement is dropped by moving what follows over it, and the
// header block is decoded fragment by fragment as its frames arrive,
// never copied.
type frameSniffer struct {
	// buf holds the preface and the frames to replay, buf[:at], then
	// bytes read but not yet parsed.
	buf []byte
	at  int
	// dec decodes the first header block; nil until its HEADERS frame.
	dec         *hpack.Decoder
	contentType string
	inHeaders   bool // a HEADERS frame without END_HEADERS was read
	gotHeaders  bool // the first header block is complete
	gotAck      bool
}

// read reads more of c into s.buf, growing it up to maxSniffBytes, and
// returns errSniffTooLarge when it is full.
func (s *frameSniffer) read(c net.Conn) error {
	if len(s.buf) == cap(s.buf) {
		if cap(s.buf) >= maxSniffBytes {
			return errSniffTooLarge
		}
		grown := make([]byte, len(s.buf), min(2*cap(s.buf), maxSniffBytes))
		copy(grown, s.buf)
		s.buf = grown
	}
	n, err := c.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	if n > 0 {
		return nil
	}
	return err
}

// step parses one frame from s.buf[s.at:], or returns errNeedMore.
func (s *frameSniffer) step() error {
	p := s.buf[s.at:]
	if len(p) < 9 {
		return errNeedMore
	}
	length := int(p[0])<<16 | int(p[1])<<8 | int(p[2])
	typ, flags := p[3], p[4]
	if length > maxFrameSize {
		return fmt.Errorf("a %d-byte frame, over the %d the client may send", length, maxFrameSize)
	}
	if s.at+9+length > maxSniffBytes {
		return errSniffTooLarge
	}
	if len(p) < 9+length {
		return errNeedMore
	}
	frame, payload := p[:9+length], p[9:9+length]
	streamID := binary.BigEndian.Uint32(frame[5:9]) & (1<<31 - 1)
	switch {
	case typ == frameSettings && flags&flagAck != 0 && !s.gotAck:
		// The acknowledgement of the splitter's own SETTINGS, the first
		// the client sends: the real server did not send that frame.
		s.gotAck = true
		s.buf = append(s.buf[:s.at], s.buf[s.at+len(frame):]...)
		return nil
	case s.inHeaders && typ != frameContinuation:
		return errors.New("a header block interrupted by another frame")
	case typ == frameHeaders && !s.gotHeaders:
		fragment, err := headersFragment(flags, payload)
		if err != nil {
			return err
		}
		if streamID == 0 {
			return errors.New("HEADERS on stream 0")
		}
		s.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == "content-type" && s.contentType == "" {
				s.contentType = f.Value
			}
		})
		s.dec.SetMaxStringLength(maxSniffBytes)
		if err := s.decode(fragment, flags); err != nil {
			return err
		}
	case typ == frameContinuation && s.inHeaders:
		if err := s.decode(payload, flags); err != nil {
			return err
		}
	}
	s.at += len(frame)
	return nil
}

// decode feeds a fragment of the first header block to the decoder.
func (s *frameSniffer) decode(fragment []byte, flags byte) error {
	if _, err := s.dec.Write(fragment); err != nil {
		return fmt.Errorf("decode the first request's headers: %w", err)
	}
	s.inHeaders = flags&flagEndHeaders == 0
	if s.inHeaders {
		return nil
	}
	s.gotHeaders = true
	err := s.dec.Close()
	s.dec = nil
	if err != nil {
		return fmt.Errorf("decode the first request's headers: %w", err)
	}
	return nil
}

// headersFragment strips a HEADERS frame's padding and priority fields.
func headersFragment(flags byte, p []byte) ([]byte, error) {
	pad := 0
	if flags&flagPadded != 0 {
		if len(p) < 1 {
			return nil, errors.New("HEADERS too short for its padding")
		}
		pad, p = int(p[0]), p[1:]
	}
	if flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, errors.New("HEADERS too short for its priority")
		}
		p = p[5:]
	}
	if pad > len(p) {
		return nil, errors.New("HEADERS padding longer than the frame")
	}
	return p[:len(p)-pad], nil
}

// isGRPCContentType reports whether grpc-go serves requests of content
// type ct: gRPC with the protobuf codec, which is all it has. gRPC with
// JSON stays with connect-go, which has both.
func isGRPCContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/grpc" || mt == "application/grpc+proto"
}
