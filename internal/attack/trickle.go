package attack

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// trickleBodyLen is the Content-Length a trickled HTTP/1.1 request
// announces; it never sends the last byte.
const trickleBodyLen = 4096

// Trickle keeps N Check requests open whose bodies arrive one byte every
// Every and never end, as a slow-body (slowloris) client does: over
// HTTP/1.1, or with H2 over cleartext HTTP/2, one stream per connection.
// A request the server cuts (answers or closes before the body ends) is
// replaced, opening one at most every OpenEvery. When Run's context ends
// it stops writing and leaves the requests open for the server's read
// timeout to cut; Close closes what is left. Set the fields before Run;
// Stats may be read at any time.
type Trickle struct {
	// Addr is the server's host:port.
	Addr  string
	N     int
	Every time.Duration
	H2    bool
	// OpenEvery is the least time between two opens (0: 10ms).
	OpenEvery time.Duration

	started, cut, dialFailed atomic.Int64
	longest                  atomic.Int64 // nanoseconds
	closing                  atomic.Bool
	mu                       sync.Mutex
	conns                    map[net.Conn]struct{}
}

// TrickleStats counts a Trickle's requests.
type TrickleStats struct {
	// Started counts requests begun, Cut those the server cut, DialFailed
	// connections that could not be made; Open is the requests still
	// trickling or waiting to be cut. Longest is the longest a request
	// lasted before its cut.
	Started, Cut, DialFailed int64
	Open                     int
	Longest                  time.Duration
}

// Stats returns the counts so far.
func (a *Trickle) Stats() TrickleStats {
	a.mu.Lock()
	open := len(a.conns)
	a.mu.Unlock()
	return TrickleStats{Started: a.started.Load(), Cut: a.cut.Load(), DialFailed: a.dialFailed.Load(), Open: open, Longest: time.Duration(a.longest.Load())}
}

// Run trickles until ctx ends.
func (a *Trickle) Run(ctx context.Context) {
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
			a.start(ctx)
		}
	}
}

// Close closes every connection still open.
func (a *Trickle) Close() {
	a.closing.Store(true)
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range a.conns {
		c.Close()
	}
}

func (a *Trickle) start(ctx context.Context) {
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
	a.started.Add(1)
	go a.trickle(ctx, c)
}

// trickle sends c's request and its body, a byte at a time, until the
// server cuts it; after ctx ends it only waits for the cut.
func (a *Trickle) trickle(ctx context.Context, c net.Conn) {
	begun := time.Now()
	cut := make(chan struct{})
	if a.H2 {
		_ = StartH2C(c)
		_ = WriteFrame(c, FrameHeaders, FlagEndHeaders, 1, CheckHeaders())
		go func() { defer close(cut); a.awaitH2Cut(c) }()
	} else {
		_, _ = fmt.Fprintf(c, "POST /quotad.v1.QuotaService/Check HTTP/1.1\r\nHost: quotad\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", trickleBodyLen)
		go func() {
			defer close(cut)
			// Any answer, or the connection's end, cuts the request.
			_, _ = c.Read(make([]byte, 1))
		}()
	}
	tick := time.NewTicker(orDefault(a.Every, 100*time.Millisecond))
	defer tick.Stop()
	sent, ticks, done := 0, tick.C, ctx.Done()
	for {
		select {
		case <-cut:
			if !a.closing.Load() {
				a.cut.Add(1)
				life := int64(time.Since(begun))
				for old := a.longest.Load(); life > old && !a.longest.CompareAndSwap(old, life); old = a.longest.Load() {
				}
			}
			c.Close()
			a.mu.Lock()
			delete(a.conns, c)
			a.mu.Unlock()
			return
		case <-done:
			done, ticks = nil, nil // stop writing; wait for the cut
		case <-ticks:
			if sent >= trickleBodyLen-1 {
				continue
			}
			if a.H2 {
				_ = WriteFrame(c, FrameData, 0, 1, []byte("{"))
			} else {
				_, _ = c.Write([]byte("{"))
			}
			sent++
		}
	}
}

// awaitH2Cut reads c's frames until the server ends stream 1 (an answer
// or a reset) or the connection.
func (a *Trickle) awaitH2Cut(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		f, err := ReadFrame(br)
		if err != nil {
			return
		}
		switch {
		case f.Stream == 1 && (f.Type == FrameRSTStream || f.Type == FrameHeaders):
			return
		case f.Type == FrameSettings && f.Flags&FlagAck == 0:
			_ = WriteFrame(c, FrameSettings, FlagAck, 0, nil)
		}
	}
}
