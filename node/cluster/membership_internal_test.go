package cluster

import (
	"bytes"
	"log"
	"log/slog"
	"strings"
	"testing"
)

// memberlist writes a warning per bad packet; a flood of them reaches the
// log at most maxMemberlistWarnings a second, and the next line let
// through says how many were dropped. Other levels pass.
func TestMemberlistWarningsAreRateLimited(t *testing.T) {
	w := &memberlistLog{log: slog.New(slog.DiscardHandler)}
	for i := range maxMemberlistWarnings + 5 {
		if _, ok := w.admit(100); ok != (i < maxMemberlistWarnings) {
			t.Fatalf("warning %d in one second: admitted %v", i+1, ok)
		}
	}
	if suppressed, ok := w.admit(101); !ok || suppressed != 5 {
		t.Fatalf("the next second's first warning: admitted %v, %d suppressed; want 5", ok, suppressed)
	}

	var out bytes.Buffer
	w = &memberlistLog{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l := log.New(w, "", 0)
	for range 1000 {
		l.Printf("[WARN] memberlist: handler queue full, dropping message (8) from=127.0.0.1:1")
	}
	l.Printf("[DEBUG] memberlist: Stream connection from=127.0.0.1:2")
	lines := strings.Count(out.String(), "\n")
	if lines > 2*maxMemberlistWarnings+1 || !strings.Contains(out.String(), "Stream connection") {
		t.Fatalf("1000 warnings and a debug line made %d log lines; want at most %d:\n%s", lines, 2*maxMemberlistWarnings+1, out.String())
	}
	t.Logf("1000 memberlist warnings made %d log lines", lines)
}
