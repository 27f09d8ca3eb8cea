package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Go's profiler, for finding where a check's time goes (README,
// "Benchmarks"): net/http/pprof's handlers on an address of their own,
// never on the API's port, and only when asked for.

// validatePprofAddr accepts "" (off) or host:port.
func validatePprofAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("pprof addr: %q is not host:port: %w", addr, err)
	}
	return nil
}

// profiler serves net/http/pprof until stopped.
type profiler struct {
	srv  *http.Server
	addr net.Addr
	done chan struct{}
}

// startProfiler listens on addr and serves the profiler there. A mux of
// its own, so that nothing else registered on http.DefaultServeMux is
// exposed with it.
func startProfiler(addr string, log *slog.Logger) (*profiler, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	p := &profiler{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, addr: ln.Addr(), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof: stopped serving", "err", err)
		}
	}()
	return p, nil
}

// stop closes the profiler at once: a profile being taken is cut.
func (p *profiler) stop() {
	if p == nil {
		return
	}
	p.srv.Close()
	<-p.done
}
