package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

// memberlist closes its sockets before it stops its own gossip timers, so
// a clean shutdown could log "Failed to send gossip … use of closed network
// connection" as an error. Once Shutdown has begun, that line is a debug
// line; before, and for any other error, the level stays.
func TestMemberlistLogQuietsClosedSocketsOnShutdown(t *testing.T) {
	const closedSend = "[ERR] memberlist: Failed to send gossip to 127.0.0.1:7946: write udp 127.0.0.1:7947->127.0.0.1:7946: use of closed network connection\n"
	const otherErr = "[ERR] memberlist: Failed to send gossip to 127.0.0.1:7946: write udp: no route to host\n"
	var buf bytes.Buffer
	var closing atomic.Bool
	w := &memberlistLog{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), closing: &closing}
	levelOf := func(line string) string {
		buf.Reset()
		if _, err := w.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		for _, l := range []string{"DEBUG", "INFO", "WARN", "ERROR"} {
			if strings.Contains(out, "level="+l) {
				return l
			}
		}
		t.Fatalf("no level in %q", out)
		return ""
	}
	if got := levelOf(closedSend); got != "ERROR" {
		t.Errorf("a closed-socket send while running: %s, want ERROR", got)
	}
	closing.Store(true)
	if got := levelOf(closedSend); got != "DEBUG" {
		t.Errorf("a closed-socket send during shutdown: %s, want DEBUG", got)
	}
	if got := levelOf(otherErr); got != "ERROR" {
		t.Errorf("another send error during shutdown: %s, want ERROR", got)
	}
}
