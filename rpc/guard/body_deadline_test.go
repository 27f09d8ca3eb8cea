package guard

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// BodyDeadline wraps the body without hiding it from net/http: an HTTP/1.1
// body the handler leaves unread, too long to drain, is answered at once
// and its connection closed, as without the wrapper (hidden, net/http
// would try to drain it until the read deadline).
func TestUnreadBodyStillClosesTheConnection(t *testing.T) {
	addr := serveBodyDeadline(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not reading that", http.StatusBadRequest)
	}), 30*time.Second)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: quotad\r\nContent-Length: %d\r\n\r\n", 1<<20)
	_, _ = c.Write(make([]byte, 1024))
	// The answer comes at once: net/http sees the body is too long to
	// drain instead of waiting for it until the read deadline.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, err := br.ReadByte(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection still open after an answer to a request whose 1 MiB body was left unread: %v", err)
	}
}

// serveBodyDeadline serves h behind BodyDeadline with d on a fresh
// loopback port, as rpc's Server does, until the test ends, and returns
// its address.
func serveBodyDeadline(t *testing.T, h http.Handler, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: BodyDeadline(h, d), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // http.ErrServerClosed after Close
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ln.Addr().String()
}
