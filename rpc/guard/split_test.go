package guard

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// startSplit is a SplitListener on a fresh loopback port.
func startSplit(t *testing.T, timeout time.Duration) (*SplitListener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewSplitListener(ln, timeout, timeout, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

// accept waits for l's next connection.
func accept(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() { r.c.Close() })
		return r.c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection within 10s")
		return nil
	}
}

// readN reads exactly n bytes from c.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// h2Opening is how an HTTP/2 client opens a connection in a test.
type h2Opening struct {
	contentType string
	// continuation splits the header block over HEADERS and CONTINUATION,
	// and pads and prioritizes the HEADERS frame.
	continuation bool
	// headersFirst sends the request before acknowledging the server's
	// SETTINGS (as clients that do not wait for them may).
	headersFirst bool
	// noAck never acknowledges the server's SETTINGS.
	noAck bool
}

// open writes o's opening on c, reading the splitter's SETTINGS where a
// client would, and returns what the server behind the splitter must read:
// everything written but the acknowledgement of that SETTINGS frame.
func (o h2Opening) open(t *testing.T, c net.Conn) []byte {
	t.Helper()
	var sent bytes.Buffer // all but the ACK
	var frames bytes.Buffer
	fr := http2.NewFramer(&frames, c)
	flush := func(keep bool) {
		if keep {
			sent.Write(frames.Bytes())
		}
		if _, err := c.Write(frames.Bytes()); err != nil {
			t.Fatal(err)
		}
		frames.Reset()
	}
	frames.WriteString(http2.ClientPreface)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteWindowUpdate(0, 1<<20); err != nil {
		t.Fatal(err)
	}
	flush(true)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/quotad.v1.QuotaService/Check"}, {Name: ":authority", Value: "quotad"},
		{Name: "content-type", Value: o.contentType}, {Name: "te", Value: "trailers"},
	} {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	request := func() {
		if o.continuation {
			half := block.Len() / 2
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes()[:half], PadLength: 3,
				Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}}); err != nil {
				t.Fatal(err)
			}
			if err := fr.WriteContinuation(1, true, block.Bytes()[half:]); err != nil {
				t.Fatal(err)
			}
		} else if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 2, 0x0a, 0}); err != nil {
			t.Fatal(err)
		}
		flush(true)
	}
	if o.headersFirst {
		request()
	}
	// The splitter's SETTINGS: empty, on stream 0.
	if got := readN(t, c, 9); !bytes.Equal(got, emptySettings[:]) {
		t.Fatalf("first server frame %x, want an empty SETTINGS", got)
	}
	if !o.noAck {
		if err := fr.WriteSettingsAck(); err != nil {
			t.Fatal(err)
		}
		flush(false)
	}
	if !o.headersFirst {
		request()
	}
	return sent.Bytes()
}

// Each connection goes to the front end its first request's content-type
// calls for, with every byte its client sent (but the acknowledgement of
// the splitter's own SETTINGS) replayed in order.
func TestSplitRoutesByFirstRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		open   h2Opening
		toGRPC bool
	}{
		{"grpc", h2Opening{contentType: "application/grpc"}, true},
		{"grpc+proto", h2Opening{contentType: "application/grpc+proto"}, true},
		{"grpc with a parameter", h2Opening{contentType: "application/grpc; charset=utf-8"}, true},
		{"grpc, headers in two frames, padded", h2Opening{contentType: "application/grpc", continuation: true}, true},
		{"grpc, request before the ack", h2Opening{contentType: "application/grpc", headersFirst: true}, true},
		{"json, request before the ack", h2Opening{contentType: "application/json", headersFirst: true}, false},
		{"json, never acknowledging", h2Opening{contentType: "application/json", noAck: true}, false},
		{"grpc+json", h2Opening{contentType: "application/grpc+json"}, false},
		{"grpc-web", h2Opening{contentType: "application/grpc-web+proto"}, false},
		{"connect", h2Opening{contentType: "application/proto"}, false},
		{"connect streaming", h2Opening{contentType: "application/connect+proto"}, false},
		{"json", h2Opening{contentType: "application/json"}, false},
		{"no content-type", h2Opening{contentType: ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := startSplit(t, 10*time.Second)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			want := tc.open.open(t, c)
			to, other := net.Listener(s.http), net.Listener(s.grpc)
			if tc.toGRPC {
				to, other = other, to
			}
			got := readN(t, accept(t, to), len(want))
			if !bytes.Equal(got, want) {
				t.Fatalf("replayed\n%x\nwant\n%x", got, want)
			}
			// Nothing went to the other front end.
			other.Close()
			if conn, err := other.Accept(); err == nil {
				conn.Close()
				t.Fatal("the other front end got a connection too")
			}
		})
	}
}

// HTTP/1 goes to net/http at its first byte that is not the HTTP/2
// preface's, replayed whole.
func TestSplitHTTP1(t *testing.T) {
	s, addr := startSplit(t, 10*time.Second)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// "PR" matches the preface's start; "PRO" does not.
	req := "PROPFIND / HTTP/1.1\r\nHost: quotad\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	conn := accept(t, s.http)
	if got := readN(t, conn, len(req)); string(got) != req {
		t.Fatalf("replayed %q, want %q", got, req)
	}
	// The connection goes on: what the client writes next arrives, and
	// what the server writes reaches the client.
	if _, err := io.WriteString(c, "more"); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, conn, 4); string(got) != "more" {
		t.Fatalf("then read %q", got)
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 204 No Content\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, c, 12); string(got) != "HTTP/1.1 204" {
		t.Fatalf("client read %q", got)
	}
}

// A connection that shows no request within the timeout is closed, and so
// is one that breaks HTTP/2's rules before its first request.
func TestSplitClosesWhatShowsNoRequest(t *testing.T) {
	s, addr := startSplit(t, 100*time.Millisecond)
	for name, send := range map[string][]byte{
		"silent":         nil,
		"preface only":   []byte(http2.ClientPreface),
		"oversize frame": append([]byte(http2.ClientPreface), 0, 0x40, 0x01, 0x0, 0, 0, 0, 0, 1), // 16385 bytes
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(send); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			// The splitter's SETTINGS may come first; then the end.
			got, err := io.ReadAll(c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the connection was not closed within 10s")
			}
			// An HTTP/2 connection idle without a stream is told why, as
			// net/http's server tells it.
			if goaway := goAwayFrame(0, 0, ""); name == "preface only" && !bytes.Equal(got, append(emptySettings[:], goaway...)) {
				t.Fatalf("read %x, want SETTINGS then GOAWAY %x", got, goaway)
			}
		})
	}
	// None reached a front end: with both closed, Accept reports that,
	// not a connection.
	s.Close()
	for _, l := range []net.Listener{s.grpc, s.http} {
		if c, err := l.Accept(); err == nil {
			c.Close()
			t.Fatal("a connection without a request reached a front end")
		}
	}
}

// Closing both front ends' listeners closes the shared one; Accept then
// fails on both.
func TestSplitClose(t *testing.T) {
	s, addr := startSplit(t, time.Second)
	if err := s.grpc.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Fatalf("the shared listener closed with one front end still open: %v", err)
	} else {
		c.Close()
	}
	if err := s.http.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.http.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, l := range []net.Listener{s.grpc, s.http} {
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the shared listener still accepts after both front ends closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The splitter holds at most maxSniffBytes of a connection before its
// first request's headers end, and only until the read-header timeout: a
// first header block past the bound, or still unfinished at the timeout,
// gets a GOAWAY saying which, and the connection closes; neither reaches a
// front end.
func TestSplitBoundsUnfinishedHeaders(t *testing.T) {
	s, addr := startSplit(t, 500*time.Millisecond)
	for _, tc := range []struct {
		name      string
		block     int
		wantDebug string
	}{
		{"over the bound", 64 << 10, "take more than 16384 bytes"},
		{"never finished", 1 << 10, "did not end within the read-header timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			go func() {
				var frames bytes.Buffer
				fr := http2.NewFramer(&frames, nil)
				frames.WriteString(http2.ClientPreface)
				_ = fr.WriteSettings()
				// Frames of the largest size allowed, none ending the block.
				block := paddingBlock(tc.block)
				k := min(len(block), 1<<14)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:k]})
				for block = block[k:]; len(block) > 0; block = block[k:] {
					k = min(len(block), 1<<14)
					_ = fr.WriteContinuation(1, false, block[:k])
				}
				_, _ = c.Write(frames.Bytes())
			}()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			fr := http2.NewFramer(nil, c)
			var goaway *http2.GoAwayFrame
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					break
				}
				if g, ok := f.(*http2.GoAwayFrame); ok {
					goaway = g
				}
			}
			if goaway == nil || goaway.ErrCode != http2.ErrCodeEnhanceYourCalm || !bytes.Contains(goaway.DebugData(), []byte(tc.wantDebug)) {
				t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM saying %q", goaway, tc.wantDebug)
			}
			t.Logf("GOAWAY %s: %s", goaway.ErrCode, goaway.DebugData())
		})
	}
	s.Close()
	for _, l := range []net.Listener{s.grpc, s.http} {
		if c, err := l.Accept(); err == nil {
			c.Close()
			t.Fatal("a connection without a complete first request reached a front end")
		}
	}
}

// paddingBlock is a valid HPACK block of about n bytes of literal fields.
func paddingBlock(n int) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for i := 0; b.Len() < n; i++ {
		_ = enc.WriteField(hpack.HeaderField{Name: "x-pad", Value: string(bytes.Repeat([]byte{'a'}, 100)), Sensitive: true})
	}
	return b.Bytes()
}
