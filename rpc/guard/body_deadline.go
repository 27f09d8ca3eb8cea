package guard

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// This file is the read deadline of request bodies (rpc.ServerConfig.ReadTimeout).

// BodyDeadline returns next with every request body given d to arrive,
// from the moment its handler starts to the body's end, through the
// connection's read deadline (HTTP/1.1) or the stream's (HTTP/2); d should
// be positive. The deadline is lifted once the body has been read to its
// end, so a response may stream for as long as it likes. Requests without
// a body are left alone, as are those whose ResponseWriter cannot set a
// read deadline (net/http's can). A body that misses the deadline fails
// its Read with an error wrapping os.ErrDeadlineExceeded, and an HTTP/1.1
// connection is closed after the response: what is left of the body would
// otherwise be read as the next request. The handler is safe for
// concurrent use if next is; it adds no waiting of its own.
func BodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			// Only a ResponseWriter that supports no deadline fails here,
			// which net/http's do not.
			next.ServeHTTP(w, r)
			return
		}
		// A shallow copy carries the wrapped body: net/http keeps judging
		// the original (an HTTP/1.1 body left unread past its limit closes
		// the connection rather than be read as the next request).
		wrapped := *r
		wrapped.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, timeout: d, w: w, http1: r.ProtoMajor == 1}
		next.ServeHTTP(w, &wrapped)
	})
}

// deadlineBody lifts its request's read deadline when the body ends, and
// explains the error when the deadline passes first.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	w       http.ResponseWriter
	http1   bool
	lifted  bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		if !b.lifted {
			b.lifted = true
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		if b.http1 {
			// Set before the handler answers, so net/http closes the
			// connection after the response.
			b.w.Header().Set("Connection", "close")
		}
		err = fmt.Errorf("request body not received within the read timeout (%s): %w", b.timeout, err)
	}
	return n, err
}
