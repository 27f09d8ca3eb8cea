package guard

import "encoding/binary"

// This file is the HTTP/2 framing the guards read and write (RFC 9113
// §3.4, §4.1, §6): the sniffer, the replay and the rapid-reset guard each
// follow a client's frames without an HTTP/2 stack of their own.

// h2Preface is what every HTTP/2 client sends first.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame layout: the frame header's length, the frame types and
// flags the guards read, and the error code of the GOAWAYs they send.
const (
	h2FrameHeaderLen = 9

	h2FrameHeaders      = 0x1
	h2FrameRSTStream    = 0x3
	h2FrameSettings     = 0x4
	h2FrameGoAway       = 0x7
	h2FrameContinuation = 0x9

	h2FlagAck        = 0x1
	h2FlagEndHeaders = 0x4
	h2FlagPadded     = 0x8
	h2FlagPriority   = 0x20

	h2EnhanceYourCalm = 0xb
	h2NoError         = 0x0

	// h2MaxStreamID is the highest stream identifier: a GOAWAY naming it
	// tells the client to open no more streams while every stream it has
	// opened may still be answered (RFC 9113 §6.8, a graceful shutdown's
	// first GOAWAY).
	h2MaxStreamID = 1<<31 - 1
)

// goAwayFrame encodes a GOAWAY frame (RFC 9113 §6.8).
func goAwayFrame(lastStream uint32, code uint32, debug string) []byte {
	f := make([]byte, h2FrameHeaderLen+8+len(debug))
	length := 8 + len(debug)
	f[0], f[1], f[2] = byte(length>>16), byte(length>>8), byte(length)
	f[3] = h2FrameGoAway
	binary.BigEndian.PutUint32(f[9:], lastStream&0x7fffffff)
	binary.BigEndian.PutUint32(f[13:], code)
	copy(f[17:], debug)
	return f
}

// frameCursor follows a stream of HTTP/2 frames across reads or writes of
// any size.
type frameCursor struct {
	// hdr is the header of the current frame; hdrN of its bytes have been
	// seen. left is the payload still to come.
	hdr  [h2FrameHeaderLen]byte
	hdrN int
	left int
}

// atBoundary reports whether the next byte starts a frame.
func (f *frameCursor) atBoundary() bool { return f.hdrN == 0 && f.left == 0 }

// step consumes bytes of b up to the end of the current frame's header or
// payload, and reports how many and whether it just completed a header
// (now in f.hdr).
func (f *frameCursor) step(b []byte) (n int, header bool) {
	if f.left > 0 {
		n = min(f.left, len(b))
		f.left -= n
		return n, false
	}
	n = copy(f.hdr[f.hdrN:], b)
	f.hdrN += n
	if f.hdrN < h2FrameHeaderLen {
		return n, false
	}
	f.hdrN = 0
	f.left = int(f.hdr[0])<<16 | int(f.hdr[1])<<8 | int(f.hdr[2])
	return n, true
}

// untilBoundary consumes b up to the next frame boundary (or all of b) and
// returns how many bytes it consumed; 0 when already at one.
func (f *frameCursor) untilBoundary(b []byte) int {
	used := 0
	for used < len(b) && !f.atBoundary() {
		n, _ := f.step(b[used:])
		used += n
	}
	return used
}

// skip consumes all of b.
func (f *frameCursor) skip(b []byte) {
	for len(b) > 0 {
		n, _ := f.step(b)
		b = b[n:]
	}
}
