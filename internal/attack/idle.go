package attack

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// IdleKind is what an idle connection does before it goes quiet.
type IdleKind int

const (
	// Silent connects and sends nothing.
	Silent IdleKind = iota
	// KeepAlive makes one HTTP/1.1 request (GET /healthz) and keeps the
	// connection open.
	KeepAlive
	// H2C opens a cleartext HTTP/2 connection (preface, SETTINGS, and the
	// ACK of the server's SETTINGS) and opens no stream.
	H2C
)

func (k IdleKind) String() string {
	switch k {
	case Silent:
		return "silent"
	case KeepAlive:
		return "keep-alive"
	case H2C:
		return "h2c"
	}
	return "unknown"
}

// IdleConns hoards idle connections to a server: it keeps N of them open,
// opening one at most every OpenEvery and replacing those the server
// closes. When Run's context ends it opens no more and leaves the ones it
// holds open for the server to close (its idle and header timeouts);
// Close closes what is left. Set the fields before Run; Stats may be read
// at any time.
type IdleConns struct {
	// Addr is the server's host:port.
	Addr string
	Kind IdleKind
	// N is how many connections to hold.
	N int
	// OpenEvery is the least time between two opens (0: 10ms).
	OpenEvery time.Duration

	opened, closedByServer, goAways, dialFailed atomic.Int64
	closing                                     atomic.Bool
	mu                                          sync.Mutex
	conns                                       map[net.Conn]struct{}
}

// IdleStats counts what an IdleConns did and what the server did to it.
type IdleStats struct {
	// Opened counts connections made; ClosedByServer those the server
	// ended (by closing, or by a GOAWAY then closing); GoAways the GOAWAY
	// frames seen on h2c connections; DialFailed connections that could
	// not be made. Open is the connections held now.
	Opened, ClosedByServer, GoAways, DialFailed int64
	Open                                        int
}

// Stats returns the counts so far.
func (a *IdleConns) Stats() IdleStats {
	a.mu.Lock()
	open := len(a.conns)
	a.mu.Unlock()
	return IdleStats{Opened: a.opened.Load(), ClosedByServer: a.closedByServer.Load(), GoAways: a.goAways.Load(), DialFailed: a.dialFailed.Load(), Open: open}
}

// Run holds the connections until ctx ends.
func (a *IdleConns) Run(ctx context.Context) {
	t := time.NewTicker(orDefault(a.OpenEvery, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // a tick and the end at once: the end wins
			return
		}
		if a.Stats().Open < a.N {
			a.open()
		}
	}
}

// Close closes every connection still held.
func (a *IdleConns) Close() {
	a.closing.Store(true)
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range a.conns {
		c.Close()
	}
}

func (a *IdleConns) open() {
	c, err := net.DialTimeout("tcp", a.Addr, 2*time.Second)
	if err != nil {
		a.dialFailed.Add(1)
		return
	}
	a.mu.Lock()
	if a.conns == nil {
		a.conns = make(map[net.Conn]struct{})
	}
	a.conns[c] = struct{}{}
	a.mu.Unlock()
	a.opened.Add(1)
	switch a.Kind {
	case KeepAlive:
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: quotad\r\n\r\n")
	case H2C:
		_ = StartH2C(c)
	}
	go a.watch(c)
}

// watch reads c until the server ends it.
func (a *IdleConns) watch(c net.Conn) {
	br := bufio.NewReader(c)
	switch a.Kind {
	case KeepAlive:
		if resp, err := http.ReadResponse(br, nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		_, _ = io.Copy(io.Discard, br)
	case H2C:
		for {
			f, err := ReadFrame(br)
			if err != nil {
				break
			}
			switch {
			case f.Type == FrameGoAway:
				a.goAways.Add(1)
			case f.Type == FrameSettings && f.Flags&FlagAck == 0:
				_ = WriteFrame(c, FrameSettings, FlagAck, 0, nil)
			case f.Type == FramePing && f.Flags&FlagAck == 0:
				_ = WriteFrame(c, FramePing, FlagAck, 0, f.Payload)
			}
		}
	default:
		_, _ = io.Copy(io.Discard, br)
	}
	if !a.closing.Load() {
		a.closedByServer.Add(1)
	}
	c.Close()
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
}

// GoAwayCode returns the last stream id and error code of a GOAWAY frame.
func (f Frame) GoAwayCode() (lastStream, code uint32) {
	if f.Type != FrameGoAway || len(f.Payload) < 8 {
		return 0, 0
	}
	return binary.BigEndian.Uint32(f.Payload[0:4]) & 0x7fffffff, binary.BigEndian.Uint32(f.Payload[4:8])
}

// orDefault returns d, or def when d is not positive.
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
