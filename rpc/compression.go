package rpc

import (
	"bytes"
	"compress/gzip"
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
// on the 2-core test machine; Go preempts a goroutine only after 10 ms or
// more, so on a node with one processor every other request, a single
// Check included, would wait behind a gzip bomb that long. (A variable
// only so that BenchmarkCheckBesideGzipBombs can compare with no yields.)
var gzipYieldEvery int64 = 256 << 10

// maxDeflateRatio bounds how many bytes one byte of deflate data can
// inflate to: a 258-byte match costs at least 2 bits, 1032 bytes a byte;
// rounded up for the blocks' headers' sake, never down.
const maxDeflateRatio = 1100

// gzipProbeBytes is the buffer a decompressor inflates into to measure a
// message before connect-go reads it.
const gzipProbeBytes = 32 << 10

// boundedGzip replaces connect-go's gzip with one whose decompressor
// refuses a message that inflates past maxBytes before connect-go reads
// any of it (connect-go would read up to maxBytes+1 bytes of it into a
// buffer it grows by doubling, each growth a new, zeroed allocation, to
// judge its size), and otherwise yields the message as gzip does.
// Responses are compressed as before.
func boundedGzip(maxBytes int) connect.HandlerOption {
	return connect.WithCompression(compressionGzip,
		func() connect.Decompressor { return &boundedGzipReader{max: int64(maxBytes)} },
		func() connect.Compressor { return gzip.NewWriter(io.Discard) },
	)
}

// boundedGzipReader is a gzip reader that refuses a message larger than
// max, measured as cheaply as can be before any of it is yielded, and lets
// other goroutines run every gzipYieldEvery bytes it inflates. It is not
// safe for concurrent use (connect-go pools decompressors, one per
// message).
//
// connect-go passes Reset the whole compressed message as a *bytes.Buffer.
// Reset measures it there, without consuming it: a message so short that
// even deflate's best ratio keeps it within max is within max; any other
// is inflated into a small buffer, which is kept, and counted up to max+1.
// Read then refuses a message found too large with ResourceExhausted, and
// a corrupt one fails as gzip says. (The gzip trailer's ISIZE, the last
// member's inflated size, cannot stand in for the count: a message that
// is cut short or has bytes after its end has no trailer there, and its
// last four bytes would call it too large.) Should src be something else,
// Read stops after max+1 bytes instead, which is enough for connect-go to
// judge.
type boundedGzipReader struct {
	gz gzip.Reader
	// max is the largest message allowed; read counts the bytes yielded
	// since the last Reset, sinceYield those inflated since the last yield.
	max, read, sinceYield int64
	// refusal is why the message was found too large, if it was.
	refusal error
	// probe and probeBuf measure a message in Reset.
	probe    gzip.Reader
	probeBuf []byte
}

var _ connect.Decompressor = (*boundedGzipReader)(nil)

// Read implements io.Reader.
func (r *boundedGzipReader) Read(p []byte) (int, error) {
	if r.refusal != nil {
		// connect-go returns a *connect.Error from a decompressor as it is.
		return 0, r.refusal
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
	r.inflated(n)
	return n, err
}

// inflated counts n bytes inflated and yields the processor every
// gzipYieldEvery of them.
func (r *boundedGzipReader) inflated(n int) {
	if r.sinceYield += int64(n); r.sinceYield >= gzipYieldEvery {
		r.sinceYield = 0
		runtime.Gosched()
	}
}

// Reset implements connect.Decompressor: it starts a new message from src,
// and measures it first if src lets it (see boundedGzipReader).
func (r *boundedGzipReader) Reset(src io.Reader) error {
	r.read, r.sinceYield, r.refusal = 0, 0, nil
	if b, ok := src.(interface{ Bytes() []byte }); ok {
		r.refusal = r.measure(b.Bytes())
	}
	return r.gz.Reset(src)
}

// measure returns the refusal of msg if it inflates past max, or nil.
func (r *boundedGzipReader) measure(msg []byte) error {
	if int64(len(msg)) <= r.max/maxDeflateRatio {
		return nil
	}
	if err := r.probe.Reset(bytes.NewReader(msg)); err != nil {
		return nil // not gzip: the read itself says so
	}
	if r.probeBuf == nil {
		r.probeBuf = make([]byte, gzipProbeBytes)
	}
	var size int64
	for size <= r.max {
		n, err := r.probe.Read(r.probeBuf[:min(int64(len(r.probeBuf)), r.max+1-size)])
		size += int64(n)
		r.inflated(n)
		if err != nil {
			return nil // the end, or an error the read itself will meet
		}
	}
	return connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("message is larger than configured max %d: gzip: %w after %d bytes", r.max, errDecompressedTooLarge, size))
}

// Close implements connect.Decompressor.
func (r *boundedGzipReader) Close() error { return r.gz.Close() }
