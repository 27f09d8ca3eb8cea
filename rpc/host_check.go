package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// This file guards the operator's pages (the console, GET /status and
// GET /cluster) and, on a server without an admin token, the admin calls
// (Reset) against DNS rebinding: a web page on a name its author controls
// (evil.example) that the author then points at quotad's address. The
// browser sees one origin, so the page may read /status and call Reset as
// if it were quotad's own; but every request it sends still carries
// Host: evil.example. These requests are answered only for a Host quotad
// knows to be its own: by default a name of the loopback (localhost and
// names under .localhost, which browsers resolve themselves), an IP
// address (a rebinding page always has a name), and the names of
// Config.AllowedHosts. Check calls are not Host-checked: service meshes
// and proxies send whatever authority they route by, and a check is what
// any client may make anyway. Neither are /healthz, /readyz and /metrics,
// which probes and scrapers reach by names quotad cannot know, and which
// show nothing of a client's keys.

// AllowAnyHost is the item of Config.AllowedHosts that, given alone,
// turns the Host check off.
const AllowAnyHost = "*"

// hostPolicy says which Host headers the guarded pages and calls answer.
// Safe for concurrent use (read-only once built).
type hostPolicy struct {
	any   bool
	names map[string]bool // lower-cased, without a trailing dot
	// ips are the IP addresses allowed; nil with anyIP.
	ips map[string]bool
	// anyIP allows every IP address (a listener on every interface);
	// loopbackIPs every loopback address.
	anyIP, loopbackIPs bool
}

// newHostPolicy returns the policy of a server listening on listen
// (host:port as configured; the port does not matter) that also allows
// the names in allowed (AllowAnyHost allows all). By the listen address:
// every IP address when it is empty or unspecified (":8080", "0.0.0.0",
// "[::]"); the loopback addresses when it is one (or "localhost") or a
// Unix socket (unix:PATH); else that IP address, or that name. The
// loopback names are always allowed.
func newHostPolicy(listen string, allowed []string) *hostPolicy {
	p := &hostPolicy{names: map[string]bool{}, ips: map[string]bool{}}
	for _, a := range allowed {
		if a == AllowAnyHost {
			p.any = true
		}
		p.add(a)
	}
	host := listen
	if h, _, err := net.SplitHostPort(listen); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	switch {
	case strings.HasPrefix(listen, "unix:"):
		// A Unix socket's clients are on this machine, and no browser
		// dials one: the loopback names and addresses are its own.
		p.loopbackIPs = true
	case host == "" || ip != nil && ip.IsUnspecified():
		p.anyIP = true
	case ip != nil && ip.IsLoopback(), strings.EqualFold(host, "localhost"):
		p.loopbackIPs = true
	default:
		p.add(host)
	}
	return p
}

// add allows one name or IP address.
func (p *hostPolicy) add(h string) {
	h = strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
	if ip := net.ParseIP(h); ip != nil {
		p.ips[ip.String()] = true
		return
	}
	p.names[h] = true
}

// allows reports whether a request with Host header hostHeader may see
// the guarded pages and make the guarded calls. An empty Host (HTTP/1.0,
// which no browser sends) is allowed.
func (p *hostPolicy) allows(hostHeader string) bool {
	if p.any || hostHeader == "" {
		return true
	}
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if ip := net.ParseIP(host); ip != nil {
		return p.anyIP || p.loopbackIPs && ip.IsLoopback() || p.ips[ip.String()]
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || p.names[host]
}

// errHostNotAllowed is wrapped by the refusal of a request whose Host is
// not allowed.
var errHostNotAllowed = errors.New("this Host is not one quotad knows as its own")

// check returns nil when hostHeader is allowed, else an error that says
// which setting allows it.
func (p *hostPolicy) check(hostHeader string) error {
	if p.allows(hostHeader) {
		return nil
	}
	return fmt.Errorf("request Host %q: %w: the console, /status, /cluster and (without an admin token) admin calls answer only "+
		"localhost, the IP addresses quotad listens on and the names in --allowed-hosts (a guard against DNS rebinding); "+
		"add this name to --allowed-hosts (comma-separated; * allows every Host)", hostHeader, errHostNotAllowed)
}

// page serves h only to requests with an allowed Host; others get 403
// with the reason.
func (p *hostPolicy) page(h http.Handler) http.Handler {
	if p.any {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.check(r.Host); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// withAdminHost passes on the Host of each admin call to h in the call's
// context, for the admin guard's interceptor (connect-go hands
// interceptors the headers without Host); other requests pass untouched.
func withAdminHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isAdminProcedure(r.URL.Path) {
			r = r.WithContext(context.WithValue(r.Context(), hostKey{}, r.Host))
		}
		h.ServeHTTP(w, r)
	})
}

// hostKey is the context key of withAdminHost.
type hostKey struct{}

// requestHost is the Host withAdminHost put in ctx; "" if none.
func requestHost(ctx context.Context) string {
	h, _ := ctx.Value(hostKey{}).(string)
	return h
}

// validAllowedHost reports what is wrong with h as an item of a list of n
// allowed hosts.
func validAllowedHost(h string, n int) error {
	switch {
	case h == AllowAnyHost && n > 1:
		return fmt.Errorf("%s allows every Host: give it alone", AllowAnyHost)
	case h == AllowAnyHost:
		return nil
	case net.ParseIP(strings.Trim(h, "[]")) != nil:
		return nil
	case h == "" || strings.ContainsAny(h, ":/@ *\t"):
		return fmt.Errorf("%q is not a host name or IP address: give the name alone, without a scheme, port or path (e.g. quotad.example.com)", h)
	}
	return nil
}
