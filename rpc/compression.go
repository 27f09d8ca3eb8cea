package rpc

import (
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"

	"connectrpc.com/connect"
)

// errDecompressedTooLarge ends the inflation of a request message that has
// grown past the limit: connect-go would otherwise inflate the rest only to
// report its size, and a 4 MiB gzip body can inflate to 4 GiB.
var errDecompressedTooLarge = errors.New("stopped inflating")

// compressionGzip is the one compression quotad accepts, under the name
// Connect, gRPC and gRPC-Web all use for it.
const compressionGzip = "gzip"

// gzipYieldEvery is how many bytes a decompressor inflates between yields
// of its processor. Inflating a message to the 2 MiB bound takes 2-4 ms
// on the 2-core test machine, and connect-go grows the buffer it inflates
// into as it goes (50 ms when the memory is fresh); Go preempts a
// goroutine only after 10 ms or more, so on a node with one processor
// every other request, a single Check included, would wait behind a gzip
// bomb that long. (A variable only so that BenchmarkCheckBesideGzipBombs
// can compare with no yields.)
var gzipYieldEvery int64 = 256 << 10

// boundedGzip replaces connect-go's gzip with one whose decompressor stops
// after maxBytes+1 bytes of output: enough for connect-go to see that the
// message is too large (it reads at most maxBytes+1 before judging) and
// fail it with ResourceExhausted, without inflating the rest. A message
// whose gzip trailer already says it is too large is refused without
// inflating any of it. Responses are compressed as before.
func boundedGzip(maxBytes int) connect.HandlerOption {
	return connect.WithCompression(compressionGzip,
		func() connect.Decompressor { return &boundedGzipReader{max: int64(maxBytes)} },
		func() connect.Compressor { return gzip.NewWriter(io.Discard) },
	)
}

// boundedGzipReader is a gzip reader that yields at most max+1 bytes per
// Reset and then fails with errDecompressedTooLarge, and lets other
// goroutines run every gzipYieldEvery bytes. It is not safe for concurrent
// use (connect-go pools decompressors, one per message).
type boundedGzipReader struct {
	gz gzip.Reader
	// max is the largest message allowed; read counts the bytes yielded
	// since the last Reset, sinceYield since the last yield.
	max, read, sinceYield int64
	// declared is the size the message's gzip trailer gives, or -1.
	declared int64
}

var _ connect.Decompressor = (*boundedGzipReader)(nil)

// Read implements io.Reader.
func (r *boundedGzipReader) Read(p []byte) (int, error) {
	if r.declared > r.max {
		// connect-go returns a *connect.Error from a decompressor as it is.
		return 0, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("message size %d (from its gzip trailer) is larger than configured max %d", r.declared, r.max))
	}
	left := r.max + 1 - r.read
	if left <= 0 {
		return 0, fmt.Errorf("gzip: %w after %d bytes", errDecompressedTooLarge, r.read)
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := r.gz.Read(p)
	r.read += int64(n)
	if r.sinceYield += int64(n); r.sinceYield >= gzipYieldEvery {
		r.sinceYield = 0
		runtime.Gosched()
	}
	return n, err
}

// Reset implements connect.Decompressor: it starts a new message from src.
// connect-go passes the whole compressed message as a *bytes.Buffer, whose
// last four bytes are the gzip trailer's ISIZE: the inflated size of the
// last member, modulo 2^32. That is never more than the whole message
// inflates to (the sizes of the members before it add to it, and the
// modulo only takes away), so a trailer over the bound proves the message
// too large. A smaller one proves nothing (a bomb can end in a small
// member), and inflation is bounded as before.
func (r *boundedGzipReader) Reset(src io.Reader) error {
	r.read, r.sinceYield, r.declared = 0, 0, -1
	if b, ok := src.(interface{ Bytes() []byte }); ok {
		r.declared = gzipDeclaredSize(b.Bytes())
	}
	return r.gz.Reset(src)
}

// Close implements connect.Decompressor.
func (r *boundedGzipReader) Close() error { return r.gz.Close() }

// gzipDeclaredSize is the ISIZE field of the gzip stream msg ends with
// (RFC 1952, 2.3.1), or -1 if msg is too short for a gzip member or does
// not start like one.
func gzipDeclaredSize(msg []byte) int64 {
	// A member is at least a 10-byte header, an empty deflate block
	// (2 bytes) and the 8-byte trailer.
	const smallest = 20
	if len(msg) < smallest || msg[0] != 0x1f || msg[1] != 0x8b {
		return -1
	}
	return int64(binary.LittleEndian.Uint32(msg[len(msg)-4:]))
}
