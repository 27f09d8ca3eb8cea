package cluster

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file turns memberlist's log lines into slog records, rate-limited.

// maxMemberlistWarnings is how many warning and error lines of
// memberlist's the log takes per second; the rest are counted and
// reported in the next line let through. memberlist writes one per bad
// packet ("decrypt packet failed", "handler queue full"), so a flood of
// junk would otherwise cost a log line per packet.
const maxMemberlistWarnings = 20

// memberlistLog turns memberlist's "[LEVEL] memberlist: text" lines into
// slog records at the same level, at most maxMemberlistWarnings warnings
// and errors a second; once closing is set, its failures to write to its
// own closed sockets are debug lines. memberlist writes from many
// goroutines.
type memberlistLog struct {
	log     *slog.Logger
	closing *atomic.Bool

	mu sync.Mutex
	// second is the Unix second being counted; sent the warnings and
	// errors let through in it, and suppressed those dropped since the
	// last one let through.
	second           int64
	sent, suppressed int
}

func (w *memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for _, l := range [...]struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}, {"[ERROR]", slog.LevelError}} {
		if rest, ok := strings.CutPrefix(line, l.prefix); ok {
			line, level = strings.TrimSpace(rest), l.level
			break
		}
	}
	if level > slog.LevelDebug && w.closing != nil && w.closing.Load() && strings.Contains(line, "use of closed network connection") {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !w.log.Enabled(ctx, level) {
		return len(p), nil
	}
	var attrs []any
	if level >= slog.LevelWarn {
		suppressed, ok := w.admit(time.Now().Unix())
		if !ok {
			return len(p), nil
		}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed_before", suppressed)
		}
	}
	w.log.Log(ctx, level, strings.TrimPrefix(line, "memberlist: "), append(attrs, "component", "memberlist")...)
	return len(p), nil
}

// admit counts a warning in second and reports whether it goes to the log
// and, if so, how many were dropped since the last that did.
func (w *memberlistLog) admit(second int64) (suppressed int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if second != w.second {
		w.second, w.sent = second, 0
	}
	if w.sent >= maxMemberlistWarnings {
		w.suppressed++
		return 0, false
	}
	w.sent++
	suppressed, w.suppressed = w.suppressed, 0
	return suppressed, true
}
