package attack

import (
	"encoding/binary"
	"io"
)

// HTTP/2 frames, by hand (RFC 9113 §4.1, §6): enough to play a client that
// misbehaves.
const (
	// H2Preface is the client connection preface of HTTP/2.
	H2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

	FrameData      = 0x0
	FrameHeaders   = 0x1
	FrameRSTStream = 0x3
	FrameSettings  = 0x4
	FramePing      = 0x6
	FrameGoAway    = 0x7

	FlagEndStream  = 0x1
	FlagAck        = 0x1
	FlagEndHeaders = 0x4
)

// WriteFrame writes one frame of type typ on stream to w.
func WriteFrame(w io.Writer, typ, flags byte, stream uint32, payload []byte) error {
	hdr := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[5:], stream)
	_, err := w.Write(append(hdr, payload...))
	return err
}

// Frame is one HTTP/2 frame read from a connection.
type Frame struct {
	Type, Flags byte
	Stream      uint32
	Payload     []byte
}

// ReadFrame reads the next frame from r.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: hdr[3], Flags: hdr[4], Stream: binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff}
	f.Payload = make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
	_, err := io.ReadFull(r, f.Payload)
	return f, err
}

// StartH2C writes what opens a cleartext HTTP/2 connection: the preface and
// an empty SETTINGS frame.
func StartH2C(w io.Writer) error {
	if _, err := io.WriteString(w, H2Preface); err != nil {
		return err
	}
	return WriteFrame(w, FrameSettings, 0, 0, nil)
}

// CheckHeaders is an HPACK block (RFC 7541) for POST
// /quotad.v1.QuotaService/Check with a JSON content type: :method POST and
// :scheme http from the static table, the rest literals without indexing
// whose names are static-table entries (values under 127 bytes, no
// Huffman coding).
func CheckHeaders() []byte {
	lit := func(name []byte, v string) []byte { return append(append(name, byte(len(v))), v...) }
	b := []byte{0x83, 0x86}                                              // :method POST, :scheme http
	b = append(b, lit([]byte{0x04}, "/quotad.v1.QuotaService/Check")...) // :path (4)
	b = append(b, lit([]byte{0x01}, "quotad")...)                        // :authority (1)
	// content-type is entry 31: past the 4-bit prefix, 15 then 31-15.
	b = append(b, lit([]byte{0x0f, 31 - 15}, "application/json")...)
	return b
}
