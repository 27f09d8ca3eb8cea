package quotadclient

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// KeyFunc returns the rate-limit key of a request: whom the limit counts.
// quotad accepts keys of 1 to 1024 bytes. An error means the request has no
// usable key; the middleware answers 400 Bad Request with the error's text.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is wrapped by the errors of this package's key functions.
var ErrNoKey = errors.New("no rate-limit key")

// KeyByHeader keys requests by the value of the named header (the first one,
// if sent several times), e.g. an API key in X-API-Key. A request without
// it, or with it empty, has no key (400 Bad Request).
func KeyByHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
	}
}

// KeyByIP keys requests by the client's IP address, written in its
// canonical form (IPv4-mapped IPv6 addresses as IPv4, without zone).
//
// With no trusted proxies it is the address of the TCP peer
// (Request.RemoteAddr), and X-Forwarded-For is ignored: anyone can send that
// header, so trusting it would let every client pick its own key.
//
// Behind proxies, pass the networks they send from. When the peer is in one
// of them, the key is the first address in X-Forwarded-For, read from the
// right (the entry the nearest proxy appended) towards the left, that is
// not in a trusted network: the client as the outermost trusted proxy saw
// it. Entries further left are the client's own claims and are never used.
// If every entry is trusted, the leftmost is the key. A malformed entry
// reached while reading is an error (400): it means a trusted proxy wrote
// something that is not an address, and guessing would be worse.
//
// Clients over IPv6 can often use a whole /64; KeyByIP keys each address
// separately.
func KeyByIP(trustedProxies ...netip.Prefix) KeyFunc {
	trusted := func(a netip.Addr) bool {
		for _, p := range trustedProxies {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := remoteIP(r.RemoteAddr)
		if err != nil {
			return "", err
		}
		if !trusted(peer) {
			return peer.String(), nil
		}
		// Several X-Forwarded-For lines form one list, in order.
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		if len(hops) == 1 && strings.TrimSpace(hops[0]) == "" {
			return peer.String(), nil
		}
		var addr netip.Addr
		for i := len(hops) - 1; i >= 0; i-- {
			if addr, err = forwardedIP(hops[i]); err != nil {
				return "", err
			}
			if !trusted(addr) {
				break
			}
		}
		// Either the first untrusted hop from the right, or (all trusted)
		// the leftmost.
		return addr.String(), nil
	}
}

// remoteIP parses Request.RemoteAddr ("host:port" for TCP).
func remoteIP(remoteAddr string) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: the connection's remote address %q is not an IP address", ErrNoKey, remoteAddr)
	}
	return a.Unmap().WithZone(""), nil
}

// forwardedIP parses one X-Forwarded-For entry: an address, or an
// address with a port as some proxies write it ("1.2.3.4:5", "[::1]:5").
func forwardedIP(entry string) (netip.Addr, error) {
	entry = strings.TrimSpace(entry)
	a, err := netip.ParseAddr(entry)
	if err != nil {
		ap, perr := netip.ParseAddrPort(entry)
		if perr != nil {
			return netip.Addr{}, fmt.Errorf("%w: X-Forwarded-For entry %q is not an IP address", ErrNoKey, entry)
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), nil
}

// KeyByRoute keys requests by their route: the method and the ServeMux
// pattern that matches them, e.g. "GET /items/{id}", so that each route has
// one limit shared by all clients (combine with KeyJoin for per-client
// limits per route). A pattern registered with a method is used as is; one
// without gets the request's method in front.
//
// Inside the mux, the pattern is Request.Pattern (Go 1.22+). When the
// middleware wraps the mux itself, the mux has not routed the request yet,
// so pass it as mux and its pattern is looked up with mux.Handler. Requests
// no pattern matches share the key "METHOD (no route)". With mux nil and no
// Request.Pattern, the request has no key (400).
func KeyByRoute(mux *http.ServeMux) KeyFunc {
	return func(r *http.Request) (string, error) {
		pattern := r.Pattern
		if pattern == "" && mux != nil {
			if _, pattern = mux.Handler(r); pattern == "" {
				return r.Method + " (no route)", nil
			}
		}
		if pattern == "" {
			return "", fmt.Errorf("%w: the request has no route pattern (use KeyByRoute inside the ServeMux, or pass the mux)", ErrNoKey)
		}
		if method, _, ok := strings.Cut(pattern, " "); ok && method != "" && !strings.Contains(method, "/") {
			return pattern, nil
		}
		return r.Method + " " + pattern, nil
	}
}

// KeyJoin keys requests by several keys at once, joined with "|", e.g.
// KeyJoin(KeyByHeader("X-API-Key"), KeyByRoute(nil)) for one limit per
// client per route. The first error is returned.
func KeyJoin(keys ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		parts := make([]string, len(keys))
		for i, k := range keys {
			p, err := k(r)
			if err != nil {
				return "", err
			}
			parts[i] = p
		}
		return strings.Join(parts, "|"), nil
	}
}
