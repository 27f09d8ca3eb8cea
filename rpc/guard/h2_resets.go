package guard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// This file guards cleartext HTTP/2 connections against rapid reset
// (CVE-2023-44487): a client that opens streams and resets them at once is
// never held back by the stream limit, so it can make the server start
// handlers as fast as it can send frames. net/http bounds the handlers
// running at once but, for handlers as quick as a check, never closes such
// a connection. The guard watches the frames the client sends and, once
// the streams it has reset outnumber the ones it let run by more than
// resetGuardSlack, sends a GOAWAY with ENHANCE_YOUR_CALM, stops passing the
// client's frames to the server, and ends the connection resetGuardDrain
// later. This is close to Envoy's rule for premature resets (more than
// half of the streams reset), without the stream-age condition: a
// legitimate client cancels some of its streams, even half of them when it
// hedges, not most of them. The slack lets a client that has just
// connected cancel a burst.
//
// The guard sits on the bytes of the connection, so it sees HTTP/2 only in
// cleartext (h2c); under TLS it would see ciphertext, find no preface and
// stand aside.

const (
	// resetGuardSlack is how far a connection's resets may outnumber the
	// streams it did not reset.
	resetGuardSlack = 100
	// resetGuardDrain is how long the client has to read the GOAWAY before
	// the connection closes; responses already under way may still go out.
	resetGuardDrain = time.Second
)

// ResetStats counts the rapid-reset guard's GOAWAYs over every connection
// of the LimitListeners that share it. The zero value is ready to use.
// Safe for concurrent use.
type ResetStats struct {
	goaways atomic.Int64
	// warns spaces the warnings about GOAWAYs sent, so that an attacker
	// who reconnects again and again is not logged per connection.
	warns warnGate
}

// GoAways returns how many connections the guard has sent a GOAWAY
// (ENHANCE_YOUR_CALM) for resetting too many of their streams.
func (s *ResetStats) GoAways() int64 { return s.goaways.Load() }

// resetGuard is one connection's guard. Its inbound side is used only by
// the goroutine reading the connection; the outbound side is under wmu.
type resetGuard struct {
	stats *ResetStats
	log   *slog.Logger

	// Inbound. preface counts the bytes of the HTTP/2 preface matched so
	// far; -1 means the connection is not HTTP/2 and is passed through.
	preface         int
	in              frameCursor
	streams, resets int
	lastStream      uint32
	// trippedAt is when the guard sent (or queued) its GOAWAY; zero
	// until then.
	trippedAt time.Time

	// h2 tells the writing side that the connection speaks HTTP/2, so its
	// bytes are frames: set once the preface has been read, which is
	// before the server writes any frame.
	h2 atomic.Bool

	wmu sync.Mutex
	out frameCursor
	// goaway is a GOAWAY frame waiting for the server's output to reach a
	// frame boundary; nil when none is waiting.
	goaway []byte
}

func newResetGuard(stats *ResetStats, log *slog.Logger) *resetGuard {
	return &resetGuard{stats: stats, log: log}
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

// read reads from conn into p and watches what it read. Once the guard
// has tripped it hands the server nothing more: it discards what the
// client still sends until resetGuardDrain has passed, then reports EOF.
func (g *resetGuard) read(conn net.Conn, p []byte) (int, error) {
	if !g.trippedAt.IsZero() {
		return 0, g.drain(conn)
	}
	n, err := conn.Read(p)
	if n > 0 && g.preface >= 0 {
		g.inspect(p[:n])
		if !g.trippedAt.IsZero() {
			// What was read goes to the server whole: a frame cut short
			// would only leave it waiting for the rest.
			g.sendGoAway(conn)
		}
	}
	return n, err
}

// drain discards the client's bytes until resetGuardDrain after the trip.
func (g *resetGuard) drain(conn net.Conn) error {
	_ = conn.SetReadDeadline(g.trippedAt.Add(resetGuardDrain))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return io.EOF
			}
			return err
		}
	}
}

// inspect follows the client's frames in b, counting new streams and
// resets, and trips the guard when the resets pass the bound.
func (g *resetGuard) inspect(b []byte) {
	if g.preface < len(h2Preface) {
		k := min(len(h2Preface)-g.preface, len(b))
		if !bytes.Equal(b[:k], []byte(h2Preface[g.preface:g.preface+k])) {
			g.preface = -1
			return
		}
		g.preface += k
		b = b[k:]
		if g.preface < len(h2Preface) {
			return
		}
		g.h2.Store(true)
	}
	for len(b) > 0 {
		n, header := g.in.step(b)
		b = b[n:]
		if !header {
			continue
		}
		stream := binary.BigEndian.Uint32(g.in.hdr[5:9]) & 0x7fffffff
		switch g.in.hdr[3] {
		case h2FrameHeaders:
			// A HEADERS frame on a stream already open is trailers.
			if stream > g.lastStream {
				g.lastStream = stream
				g.streams++
			}
		case h2FrameRSTStream:
			g.resets++
			if g.resets-(g.streams-g.resets) > resetGuardSlack && g.trippedAt.IsZero() {
				g.trippedAt = time.Now()
			}
		}
	}
}

// sendGoAway queues the GOAWAY and writes it now if the server's output is
// between frames; otherwise the server's next write completes the frame in
// progress and carries it.
func (g *resetGuard) sendGoAway(conn net.Conn) {
	total := g.stats.goaways.Add(1)
	if g.stats.warns.open() {
		g.log.Warn("http2: client reset most of its streams; sent GOAWAY ENHANCE_YOUR_CALM and closing",
			"remote", conn.RemoteAddr().String(), "streams", g.streams, "resets", g.resets, "goaways_total", total)
	}
	g.queueGoAway(conn, goAwayFrame(g.lastStream, h2EnhanceYourCalm, "too many stream resets"), true)
}

// queueGoAway writes frame, a GOAWAY, to conn now if the server's output
// is between frames; otherwise the server's next write completes the
// frame in progress and carries it. A GOAWAY already waiting stays, unless
// replace. It reports whether frame was taken.
func (g *resetGuard) queueGoAway(conn net.Conn, frame []byte, replace bool) bool {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.goaway != nil && !replace {
		return false
	}
	g.goaway = frame
	if g.out.atBoundary() {
		_, _ = conn.Write(g.goaway)
		g.goaway = nil
	}
	return true
}

// write writes p, the server's output, to conn, slipping a waiting GOAWAY
// in at the first frame boundary.
func (g *resetGuard) write(conn net.Conn, p []byte) (int, error) {
	if !g.h2.Load() {
		return conn.Write(p)
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.goaway == nil {
		g.out.skip(p)
		return conn.Write(p)
	}
	k := g.out.untilBoundary(p)
	if !g.out.atBoundary() {
		return conn.Write(p)
	}
	n, err := conn.Write(p[:k])
	if err != nil {
		return n, err
	}
	if _, err := conn.Write(g.goaway); err != nil {
		return n, err
	}
	g.goaway = nil
	g.out.skip(p[k:])
	m, err := conn.Write(p[k:])
	return n + m, err
}
