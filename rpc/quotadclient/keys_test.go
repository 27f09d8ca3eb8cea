package quotadclient_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/quotad/quotad/rpc/quotadclient"
)

func TestKeyByHeader(t *testing.T) {
	k := quotadclient.KeyByHeader("x-api-key")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := k(r); !errors.Is(err, quotadclient.ErrNoKey) {
		t.Fatalf("missing header: %v, want ErrNoKey", err)
	}
	r.Header.Add("X-Api-Key", "first")
	r.Header.Add("X-Api-Key", "second")
	if got, err := k(r); err != nil || got != "first" {
		t.Fatalf("got %q, %v; want the first value", got, err)
	}
}

func TestKeyByIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cases := []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    string // "" means an error
	}{
		{name: "peer", remote: "192.0.2.1:5000", want: "192.0.2.1"},
		{name: "peer v6", remote: "[2001:db8::1]:5000", want: "2001:db8::1"},
		{name: "peer v4-mapped", remote: "[::ffff:192.0.2.1]:5000", want: "192.0.2.1"},
		{name: "peer with zone", remote: "[fe80::1%eth0]:5000", want: "fe80::1"},
		{name: "no proxies: forwarded-for ignored", remote: "192.0.2.1:5000", xff: []string{"198.51.100.9"}, want: "192.0.2.1"},
		{name: "untrusted peer: forwarded-for ignored", trusted: proxies, remote: "192.0.2.1:5000", xff: []string{"198.51.100.9"}, want: "192.0.2.1"},
		{name: "one proxy", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"198.51.100.9"}, want: "198.51.100.9"},
		{name: "client's own claims left of the real client", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"6.6.6.6, 198.51.100.9, 10.2.2.2"}, want: "198.51.100.9"},
		{name: "several header lines", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"6.6.6.6", "198.51.100.9", "10.2.2.2"}, want: "198.51.100.9"},
		{name: "entry with port", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"198.51.100.9:443"}, want: "198.51.100.9"},
		{name: "v6 chain", trusted: proxies, remote: "[fd00::1]:5000", xff: []string{"2001:db8::7, fd00::2"}, want: "2001:db8::7"},
		{name: "all trusted: leftmost", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"10.3.3.3, 10.2.2.2"}, want: "10.3.3.3"},
		{name: "trusted peer, no header", trusted: proxies, remote: "10.1.1.1:5000", want: "10.1.1.1"},
		{name: "garbage written by a proxy", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"198.51.100.9, unknown"}},
		{name: "garbage left of the client is never read", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"<script>, 198.51.100.9"}, want: "198.51.100.9"},
		{name: "empty entry", trusted: proxies, remote: "10.1.1.1:5000", xff: []string{"198.51.100.9,,"}},
		{name: "not an IP peer", remote: "@"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, err := quotadclient.KeyByIP(tc.trusted...)(r)
			if tc.want == "" {
				if !errors.Is(err, quotadclient.ErrNoKey) {
					t.Fatalf("got %q, %v; want ErrNoKey", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestKeyByRoute(t *testing.T) {
	mux := http.NewServeMux()
	var inside string
	record := func(w http.ResponseWriter, r *http.Request) {
		k, err := quotadclient.KeyByRoute(nil)(r)
		if err != nil {
			t.Errorf("inside the mux: %v", err)
		}
		inside = k
	}
	mux.HandleFunc("GET /items/{id}", record)
	mux.HandleFunc("/static/", record)
	cases := []struct{ method, path, want string }{
		{http.MethodGet, "/items/7", "GET /items/{id}"},
		{http.MethodHead, "/items/7", "GET /items/{id}"},
		{http.MethodPost, "/static/a.css", "POST /static/"},
	}
	for _, tc := range cases {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		// Outside the mux, as middleware wrapping it sees the request.
		if got, err := quotadclient.KeyByRoute(mux)(r); err != nil || got != tc.want {
			t.Errorf("%s %s outside the mux: %q, %v; want %q", tc.method, tc.path, got, err, tc.want)
		}
		inside = ""
		mux.ServeHTTP(httptest.NewRecorder(), r)
		if inside != tc.want {
			t.Errorf("%s %s inside the mux: %q, want %q", tc.method, tc.path, inside, tc.want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/nothing", nil)
	if got, err := quotadclient.KeyByRoute(mux)(r); err != nil || got != "GET (no route)" {
		t.Errorf("unmatched: %q, %v", got, err)
	}
	if _, err := quotadclient.KeyByRoute(nil)(r); !errors.Is(err, quotadclient.ErrNoKey) {
		t.Errorf("no mux, no pattern: %v, want ErrNoKey", err)
	}
}

func TestKeyJoin(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1"
	k := quotadclient.KeyJoin(quotadclient.KeyByIP(), quotadclient.KeyByHeader("X-Tenant"))
	if _, err := k(r); !errors.Is(err, quotadclient.ErrNoKey) {
		t.Fatalf("missing part: %v", err)
	}
	r.Header.Set("X-Tenant", "acme")
	if got, err := k(r); err != nil || got != "192.0.2.1|acme" {
		t.Fatalf("got %q, %v", got, err)
	}
}
