package guard

import (
	"crypto/tls"
	"log/slog"
	"net"
)

// LimitListener accepts connections for the server within its limiter,
// ends TLS on them when tls is set, and guards them against rapid reset.
type LimitListener struct {
	net.Listener
	lim    *ConnLimiter
	resets *ResetStats
	log    *slog.Logger
	tls    *tls.Config // nil: cleartext
}

// NewLimitListener returns ln's connections admitted by lim, with TLS
// ended when tlsConf is set, guarded against rapid reset (counted in
// resets).
func NewLimitListener(ln net.Listener, lim *ConnLimiter, resets *ResetStats, tlsConf *tls.Config, log *slog.Logger) *LimitListener {
	return &LimitListener{Listener: ln, lim: lim, resets: resets, log: log, tls: tlsConf}
}

// Accept returns the next connection admitted by the limiter; connections
// it refuses are closed here and never reach the server. A TLS connection
// shakes hands on its first Read, under the deadline its reader sets.
func (l *LimitListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &ServerConn{Conn: raw, lim: l.lim}
		if !l.lim.admit(c) {
			_ = raw.Close()
			continue
		}
		var plain net.Conn = c
		if l.tls != nil {
			plain = tls.Server(c, l.tls)
		}
		// Above TLS, so that the guard reads HTTP/2 frames, not ciphertext.
		return &guardedConn{Conn: plain, guard: newResetGuard(l.resets, l.log)}, nil
	}
}
