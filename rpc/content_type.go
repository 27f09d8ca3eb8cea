package rpc

import (
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// explainContentType wraps h so that a request whose Content-Type no
// handler serves gets, with connect-go's 415 Unsupported Media Type, a body
// that says what to send: curl's -d sends
// application/x-www-form-urlencoded, and an empty 415 leaves its user
// guessing. Requests in the content types quotad serves pass straight
// through, at no cost.
func explainContentType(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || servedContentType(r.Header.Get("Content-Type")) {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&unsupportedMediaWriter{ResponseWriter: w, got: r.Header.Get("Content-Type")}, r)
	})
}

// servedContentType reports whether ct is one the Connect, gRPC and
// gRPC-Web handlers accept (a superset check: the handler decides).
func servedContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	switch {
	case mt == "application/json", mt == "application/proto",
		strings.HasPrefix(mt, "application/connect+"), strings.HasPrefix(mt, "application/grpc"):
		return true
	}
	return false
}

// unsupportedMediaWriter turns a bodiless 415 into one that explains.
type unsupportedMediaWriter struct {
	http.ResponseWriter
	got     string
	replied bool
}

func (w *unsupportedMediaWriter) WriteHeader(code int) {
	if code != http.StatusUnsupportedMediaType || w.replied {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.replied = true
	got := w.got
	if got == "" {
		got = "none"
	} else {
		got = fmt.Sprintf("%q", got)
	}
	h := w.Header()
	accepted := h.Get("Accept-Post")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
	fmt.Fprintf(w.ResponseWriter, "quotad: unsupported Content-Type %s: send JSON with -H 'Content-Type: application/json' "+
		"(or binary protobuf as application/proto, or use a Connect, gRPC or gRPC-Web client); accepted: %s\n",
		got, strings.ReplaceAll(accepted, "\n", " "))
}

func (w *unsupportedMediaWriter) Write(b []byte) (int, error) {
	if w.replied {
		// The handler writes nothing after its 415; whatever it might
		// write must not follow the explanation.
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *unsupportedMediaWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
