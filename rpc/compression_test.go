package rpc

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
)

// A message that inflates past the bound, one member or several, is
// measured by inflating it into a small buffer and refused before any of
// it is yielded; one that fits is inflated whole, and measured only if it
// is long enough to pass the bound; a corrupt one (cut short, bytes after
// its end, not gzip) fails as gzip says, never as too large.
func TestBoundedGzipReaderMeasures(t *testing.T) {
	read := func(body []byte, max int64) (*boundedGzipReader, []byte, error) {
		r := &boundedGzipReader{max: max}
		if err := r.Reset(bytes.NewBuffer(body)); err != nil {
			return r, nil, err
		}
		out, err := io.ReadAll(r)
		return r, out, err
	}

	for name, bomb := range map[string][]byte{
		"one member of 1 MiB":  gzipMembers(1 << 20),
		"1 MiB, then 1 byte":   gzipMembers(1<<20, 1),
		"four members of 1 KB": gzipMembers(1000, 1000, 1000, 1000),
	} {
		r, _, err := read(bomb, 2000)
		var cerr *connect.Error
		if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted || cerr.Message() != "message is larger than configured max 2000: gzip: stopped inflating after 2001 bytes" {
			t.Errorf("%s against 2000: %v", name, err)
		}
		if !errors.Is(err, errDecompressedTooLarge) || r.read != 0 {
			t.Errorf("%s against 2000: %v after %d bytes yielded, want %v after 0", name, err, r.read, errDecompressedTooLarge)
		}
	}

	// From a reader that cannot be measured first: stopped after max+1.
	r := &boundedGzipReader{max: 2000}
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

	whole := gzipMembers(1500)
	for name, body := range map[string][]byte{
		"cut short":           whole[:len(whole)-6],
		"bytes after its end": append(slices.Clip(whole), "garbage!"...),
		"not gzip":            []byte("not gzip at all, but long enough"),
	} {
		_, _, err := read(body, 2000)
		var cerr *connect.Error
		if err == nil || errors.Is(err, errDecompressedTooLarge) || (errors.As(err, &cerr) && cerr.Code() == connect.CodeResourceExhausted) {
			t.Errorf("%s: %v, want gzip's own error", name, err)
		}
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
	// The first yield lets it run, unless goroutines of tests running
	// beside this one (the package's servers) are queued before it: then
	// a later yield does. Without yields it runs only once the whole
	// message is inflated.
	if got := ranAt.Load(); got < 0 || got >= size {
		t.Errorf("the other goroutine ran after %d of %d bytes were inflated, want while they were (a yield every %d)", got, size, gzipYieldEvery)
	}
}
