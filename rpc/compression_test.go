package rpc

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
)

// A message whose gzip trailer gives a size over the bound is refused
// before any of it is inflated; one whose trailer fits (a bomb that ends
// in a small member) is measured by inflating it into a small buffer and
// refused before any of it is yielded; one that fits is inflated whole,
// and measured only if it is long enough to pass the bound; a body too
// short or not gzip is left to gzip.
func TestBoundedGzipReaderTrailer(t *testing.T) {
	read := func(body []byte, max int64) (*boundedGzipReader, []byte, error) {
		r := &boundedGzipReader{max: max}
		if err := r.Reset(bytes.NewBuffer(body)); err != nil {
			return r, nil, err
		}
		out, err := io.ReadAll(r)
		return r, out, err
	}

	r, _, err := read(gzipMembers(1<<20), 2000)
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted || cerr.Message() != "message size 1048576 (from its gzip trailer) is larger than configured max 2000" {
		t.Errorf("one member of 1 MiB against 2000: %v", err)
	}
	if r.read != 0 {
		t.Errorf("one member of 1 MiB against 2000: inflated %d bytes before refusing, want 0", r.read)
	}

	// A bomb whose last member is small: measured by inflating, and
	// refused before any of it is yielded.
	r, _, err = read(gzipMembers(1<<20, 1), 2000)
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted || cerr.Message() != "message is larger than configured max 2000: gzip: stopped inflating after 2001 bytes" {
		t.Errorf("1 MiB then 1 byte against 2000: %v", err)
	}
	if !errors.Is(err, errDecompressedTooLarge) || r.read != 0 {
		t.Errorf("1 MiB then 1 byte against 2000: %v after %d bytes yielded, want %v after 0", err, r.read, errDecompressedTooLarge)
	}

	// From a reader that cannot be measured first: stopped after max+1.
	r = &boundedGzipReader{max: 2000}
	if err := r.Reset(bytes.NewReader(gzipMembers(1<<20, 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(r); !errors.Is(err, errDecompressedTooLarge) || r.read != 2001 {
		t.Errorf("an unmeasured bomb against 2000: %v after %d bytes, want %v after 2001", err, r.read, errDecompressedTooLarge)
	}

	r, out, err := read(gzipMembers(1000, 1000), 2000)
	if err != nil || len(out) != 2000 {
		t.Errorf("2000 bytes against 2000: %d bytes, %v", len(out), err)
	}
	if r.probeBuf == nil {
		t.Error("2000 bytes against 2000: not measured by inflating")
	}
	// 1000 zeros compress to about 30 bytes: too few to pass 2 MiB.
	if r, out, err := read(gzipMembers(1000), 2<<20); err != nil || len(out) != 1000 || r.probeBuf != nil {
		t.Errorf("1000 bytes against 2 MiB: %d bytes, %v, inflated to measure: %t", len(out), err, r.probeBuf != nil)
	}

	if got := gzipDeclaredSize([]byte("not gzip at all, but long enough")); got != -1 {
		t.Errorf("a body that is not gzip: declared %d, want -1", got)
	}
	if got := gzipDeclaredSize(gzipMembers(5)[:19]); got != -1 {
		t.Errorf("19 bytes: declared %d, want -1", got)
	}
	if _, _, err := read([]byte("not gzip at all, but long enough"), 2000); err == nil {
		t.Error("a body that is not gzip: no error")
	}
}

// Inflating a large message lets other goroutines run every
// gzipYieldEvery bytes: on one processor, a goroutine started before the
// inflation runs before it ends. Without the yields it would wait for the
// whole message (or for the runtime's preemption, after 10 ms or more;
// 1 MiB of zeros inflates in 1-4 ms).
func TestBoundedGzipReaderYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const size = 1 << 20
	r := &boundedGzipReader{max: size}
	if err := r.Reset(bytes.NewBuffer(gzipMembers(size))); err != nil {
		t.Fatal(err)
	}
	var inflated, ranAt atomic.Int64
	ranAt.Store(-1)
	done := make(chan struct{})
	go func() {
		ranAt.Store(inflated.Load())
		close(done)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		inflated.Add(int64(n))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if got := ranAt.Load(); got < 0 || got > gzipYieldEvery+int64(len(buf)) {
		t.Errorf("the other goroutine ran after %d of %d bytes were inflated, want by %d", got, size, gzipYieldEvery+int64(len(buf)))
	}
}
