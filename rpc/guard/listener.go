package guard

import (
	"crypto/tls"
	"log/slog"
	"net"
)

// LimitListener is a net.Listener that accepts connections within its
// ConnLimiter, ends TLS on them when it has a TLS config, and puts each
// behind a rapid-reset guard: the server reads and writes HTTP/2 frames
// through it, and a client that resets most of its streams gets a GOAWAY
// (ENHANCE_YOUR_CALM) and its connection is closed. Build it with
// NewLimitListener. Safe for concurrent use, as any net.Listener; Close
// and Addr are the listener's it wraps.
type LimitListener struct {
	net.Listener
	lim    *ConnLimiter
	resets *ResetStats
	log    *slog.Logger
	tls    *tls.Config // nil: cleartext
}

// NewLimitListener returns a listener of ln's connections admitted by
// lim, with TLS ended when tlsConf is not nil (nil: cleartext), guarded
// against rapid reset, which counts its GOAWAYs in resets and logs them
// to log (warn, at most one every warnEvery, 10s; nil discards). lim
// and resets must not be nil; tlsConf must not be modified from then on.
func NewLimitListener(ln net.Listener, lim *ConnLimiter, resets *ResetStats, tlsConf *tls.Config, log *slog.Logger) *LimitListener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LimitListener{Listener: ln, lim: lim, resets: resets, log: log, tls: tlsConf}
}

// Accept waits for the next connection the limiter admits and returns
// it; connections it refuses are closed here and never reach the server.
// It returns ln's error when ln fails. A TLS connection shakes hands on
// its first Read, under the deadline its reader sets.
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
