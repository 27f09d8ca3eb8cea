package rpc

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A handshake refused for a missing client certificate is the client's
// problem: net/http's error log line goes to debug, anything else to warn.
func TestServerErrorLogLevels(t *testing.T) {
	var buf bytes.Buffer
	h := serverErrorLog{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	_, _ = h.Write([]byte("http: TLS handshake error from 127.0.0.1:1234: tls: client didn't provide a certificate\n"))
	_, _ = h.Write([]byte("http: Accept error: too many open files\n"))
	out := buf.String()
	if !strings.Contains(out, "level=DEBUG msg=\"http: TLS handshake error") || !strings.Contains(out, "level=WARN msg=\"http: Accept error") {
		t.Errorf("log:\n%s", out)
	}
}
