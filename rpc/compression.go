package rpc

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
)

// errDecompressedTooLarge ends the inflation of a request message that has
// grown past the limit: connect-go would otherwise inflate the rest only to
// report its size, and a 4 MiB gzip body can inflate to 4 GiB.
var errDecompressedTooLarge = errors.New("stopped inflating")

// compressionGzip is the one compression quotad accepts, under the name
// Connect, gRPC and gRPC-Web all use for it.
const compressionGzip = "gzip"

// boundedGzip replaces connect-go's gzip with one whose decompressor stops
// after maxBytes+1 bytes of output: enough for connect-go to see that the
// message is too large (it reads at most maxBytes+1 before judging) and
// fail it with ResourceExhausted, without inflating the rest. Responses are
// compressed as before.
func boundedGzip(maxBytes int) connect.HandlerOption {
	return connect.WithCompression(compressionGzip,
		func() connect.Decompressor { return &boundedGzipReader{max: int64(maxBytes)} },
		func() connect.Compressor { return gzip.NewWriter(io.Discard) },
	)
}

// boundedGzipReader is a gzip reader that yields at most max+1 bytes per
// Reset and then fails with errDecompressedTooLarge. It is not safe for
// concurrent use (connect-go pools decompressors, one per message).
type boundedGzipReader struct {
	gz gzip.Reader
	// max is the largest message allowed; read counts the bytes yielded
	// since the last Reset.
	max, read int64
}

var _ connect.Decompressor = (*boundedGzipReader)(nil)

// Read implements io.Reader.
func (r *boundedGzipReader) Read(p []byte) (int, error) {
	left := r.max + 1 - r.read
	if left <= 0 {
		return 0, fmt.Errorf("gzip: %w after %d bytes", errDecompressedTooLarge, r.read)
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := r.gz.Read(p)
	r.read += int64(n)
	return n, err
}

// Reset implements connect.Decompressor: it starts a new message from src.
func (r *boundedGzipReader) Reset(src io.Reader) error {
	r.read = 0
	return r.gz.Reset(src)
}

// Close implements connect.Decompressor.
func (r *boundedGzipReader) Close() error { return r.gz.Close() }
