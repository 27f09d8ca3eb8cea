package guard

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// frameBytes encodes one HTTP/2 frame with a payload of n bytes of b.
func frameBytes(typ byte, stream uint32, n int, b byte) []byte {
	f := []byte{byte(n >> 16), byte(n >> 8), byte(n), typ, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(f[5:], stream)
	return append(f, bytes.Repeat([]byte{b}, n)...)
}

// splitFrames parses b into frames, failing the test on a torn one.
func splitFrames(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		if len(b) < h2FrameHeaderLen {
			t.Fatalf("torn frame header: %x", b)
		}
		n := h2FrameHeaderLen + (int(b[0])<<16 | int(b[1])<<8 | int(b[2]))
		if len(b) < n {
			t.Fatalf("torn frame: %d of %d bytes", len(b), n)
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

// captureConn records what is written to it.
type captureConn struct {
	net.Conn
	out bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error)     { return c.out.Write(p) }
func (c *captureConn) RemoteAddr() net.Addr            { return &net.TCPAddr{} }
func (c *captureConn) SetReadDeadline(time.Time) error { return nil }

// The reset guard trips once resets outnumber the streams left to run by
// more than resetGuardSlack, however the bytes are split, and its GOAWAY
// goes out between two of the server's frames, never inside one.
func TestResetGuard(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// writeSplit writes b to w in random pieces.
	writeSplit := func(w func([]byte), b []byte) {
		for len(b) > 0 {
			n := min(len(b), 1+rng.IntN(40))
			w(b[:n])
			b = b[n:]
		}
	}
	client := func(streams, every int) []byte {
		b := []byte(h2Preface)
		b = append(b, frameBytes(0x4, 0, 0, 0)...)
		for i := range streams {
			id := uint32(2*i + 1)
			b = append(b, frameBytes(h2FrameHeaders, id, 30, 'h')...)
			if i%every == 0 {
				b = append(b, frameBytes(h2FrameRSTStream, id, 4, 0)...)
			}
		}
		return b
	}

	for _, tc := range []struct {
		name         string
		streams, rst int // every rst-th stream is reset
		trip         bool
	}{
		{"every stream reset", 300, 1, true},
		{"a third reset", 600, 3, false},
		{"half reset", 600, 2, false},
		{"within the slack", resetGuardSlack, 1, false},
		{"just past the slack", resetGuardSlack + 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newResetGuard(&ResetStats{}, slog.New(slog.DiscardHandler))
			conn := &captureConn{}
			// The server's output so far ends inside a frame, so the
			// GOAWAY must wait for the rest of it.
			server := append(frameBytes(0x4, 0, 6, 's'), frameBytes(0x0, 1, 50, 'd')...)
			g.h2.Store(true) // as inspect sets it on the preface, below
			if _, err := g.write(conn, server[:20]); err != nil {
				t.Fatal(err)
			}
			writeSplit(func(b []byte) { g.inspect(b) }, client(tc.streams, tc.rst))
			if !g.h2.Load() || g.preface != len(h2Preface) {
				t.Fatalf("preface not recognised: %d", g.preface)
			}
			if tripped := !g.trippedAt.IsZero(); tripped != tc.trip {
				t.Fatalf("tripped %t after %d streams, %d resets; want %t", tripped, g.streams, g.resets, tc.trip)
			}
			if !tc.trip {
				return
			}
			g.sendGoAway(conn)
			if conn.out.Len() != 20 {
				t.Fatalf("GOAWAY written inside a frame: %d bytes out", conn.out.Len())
			}
			writeSplit(func(b []byte) { _, _ = g.write(conn, b) }, append(server[20:], frameBytes(0x0, 3, 10, 'e')...))
			frames := splitFrames(t, conn.out.Bytes())
			if len(frames) != 4 || frames[2][3] != h2FrameGoAway {
				t.Fatalf("frames out: %d, want SETTINGS, DATA, GOAWAY, DATA", len(frames))
			}
			goaway := frames[2][h2FrameHeaderLen:]
			if last, code := binary.BigEndian.Uint32(goaway[0:4]), binary.BigEndian.Uint32(goaway[4:8]); code != h2EnhanceYourCalm || last != uint32(2*tc.streams-1) {
				t.Fatalf("GOAWAY last stream %d code %d", last, code)
			}
		})
	}

	t.Run("HTTP/1.1 passes through", func(t *testing.T) {
		g := newResetGuard(&ResetStats{}, slog.New(slog.DiscardHandler))
		g.inspect([]byte("POST / HTTP/1.1\r\n"))
		if g.preface != -1 || g.h2.Load() {
			t.Fatalf("preface %d, h2 %t", g.preface, g.h2.Load())
		}
	})
}
