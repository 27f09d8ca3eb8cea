package rpc

import "testing"

// Which Host headers the guarded pages and calls answer, by listen
// address and allowed hosts.
func TestHostPolicy(t *testing.T) {
	for _, tc := range []struct {
		listen  string
		allowed []string
		yes, no []string
	}{
		{":8080", nil,
			[]string{"localhost:8080", "localhost", "app.localhost:8080", "LocalHost.", "10.1.2.3:8080", "[::1]:8080", "[fe80::1]", "192.0.2.1", ""},
			[]string{"rebind.example:8080", "quotad", "quotad.ns.svc.cluster.local:8080", "localhost.example", "127.0.0.1.nip.io"}},
		{"0.0.0.0:8080", []string{"quotad", "quotad.ns.svc.cluster.local"},
			[]string{"quotad:8080", "QUOTAD.ns.svc.cluster.local.:8080", "10.0.0.5"},
			[]string{"quotad.ns:8080", "rebind.example"}},
		{"127.0.0.1:8080", nil,
			[]string{"localhost:8080", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080"},
			[]string{"10.0.0.5:8080", "rebind.example:8080"}},
		{"localhost:8080", nil,
			[]string{"localhost:8080", "127.0.0.1"},
			[]string{"10.0.0.5", "rebind.example"}},
		{"10.0.0.5:8080", nil,
			[]string{"10.0.0.5:8080", "localhost"},
			[]string{"10.0.0.6:8080", "127.0.0.1", "rebind.example"}},
		{"quotad.example:8080", []string{"10.0.0.9"},
			[]string{"quotad.example:8080", "10.0.0.9:8080", "localhost"},
			[]string{"10.0.0.5", "rebind.example"}},
		{"unix:/run/quotad.sock", nil,
			[]string{"localhost", "127.0.0.1", "[::1]"},
			[]string{"10.0.0.5", "rebind.example", "unix:/run/quotad.sock", "/run/quotad.sock"}},
		{"127.0.0.1:8080", []string{AllowAnyHost},
			[]string{"rebind.example:8080", "10.0.0.5"}, nil},
	} {
		p := newHostPolicy(tc.listen, tc.allowed)
		for _, h := range tc.yes {
			if !p.allows(h) {
				t.Errorf("listen %s, allowed %v: Host %q refused", tc.listen, tc.allowed, h)
			}
		}
		for _, h := range tc.no {
			if p.allows(h) {
				t.Errorf("listen %s, allowed %v: Host %q allowed", tc.listen, tc.allowed, h)
			}
		}
	}
}

// Allowed hosts are names or addresses alone; * goes alone.
func TestAllowedHostsValidate(t *testing.T) {
	for _, ok := range [][]string{{"quotad"}, {"quotad.ns.svc.cluster.local", "10.0.0.1", "[::1]"}, {"*"}} {
		if err := (Config{AllowedHosts: ok}).Validate(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range [][]string{{"http://quotad"}, {"quotad:8080"}, {""}, {"a", "*"}, {"a b"}} {
		if err := (Config{AllowedHosts: bad}).Validate(); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
