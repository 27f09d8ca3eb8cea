package memcache

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/dnstest"
	"github.com/quotad/quotad/internal/memcachedtest"
	"github.com/quotad/quotad/node"
)

// srvOf is the SRV record of srv: localhost (a target must be a name, not
// an address), its port.
func srvOf(t *testing.T, srv *memcachedtest.Server) net.SRV {
	t.Helper()
	_, port, err := net.SplitHostPort(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return net.SRV{Target: "localhost", Port: uint16(p)}
}

// named is srv's address as an SRV record names it.
func named(srv *memcachedtest.Server) string {
	_, port, _ := net.SplitHostPort(srv.Addr())
	return net.JoinHostPort("localhost", port)
}

// The servers come from an SRV record served by a real DNS server: sorted,
// looked up again every SRVRefresh, and a changed record moves the keys to
// the servers it lists.
func TestServersFromSRV(t *testing.T) {
	dns := dnstest.Start(t)
	a, b := memcachedtest.Start(t), memcachedtest.Start(t)
	const record = "_memcache._tcp.quotad.test"
	dns.Set(record, srvOf(t, b), srvOf(t, a))
	c := newClock(windowStart.Add(time.Minute))
	s, err := New(context.Background(), Config{SRV: record, SRVRefresh: 50 * time.Millisecond, Resolver: dns.Resolver(), Timeout: 2 * time.Second, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sorted := []string{named(a), named(b)}
	if sorted[1] < sorted[0] {
		sorted[0], sorted[1] = sorted[1], sorted[0]
	}
	if want := "memcache " + strings.Join(sorted, ",") + " (SRV " + record + ")"; s.Describe() != want {
		t.Fatalf("Describe %q, want %q", s.Describe(), want)
	}
	l := hourly(1)
	for i := range 20 {
		base := "{quotad:p:k" + strconv.Itoa(i) + "}"
		if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); !d.Allowed {
			t.Fatalf("%s: first check denied", base)
		}
	}
	// Twenty keys over two servers: each holds some, and each key is on
	// one of them.
	held := map[*memcachedtest.Server]int{}
	for i := range 20 {
		base := "{quotad:p:k" + strconv.Itoa(i) + "}"
		for _, srv := range []*memcachedtest.Server{a, b} {
			if counted(t, srv, base, l, c) == 1 {
				held[srv]++
			}
		}
	}
	if held[a] == 0 || held[b] == 0 || held[a]+held[b] != 20 {
		t.Errorf("twenty keys over two servers: %d and %d", held[a], held[b])
	}

	third := memcachedtest.Start(t)
	dns.Set(record, srvOf(t, third))
	deadline := time.Now().Add(10 * time.Second)
	for s.Describe() != "memcache "+named(third)+" (SRV "+record+")" {
		if time.Now().After(deadline) {
			t.Fatalf("the record changed 10s ago, the store still has %s", s.Describe())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d, _ := acquire(t, s, node.AcquireRequest{Base: "{quotad:p:k0}", Limit: l, Cost: 1}); !d.Allowed {
		t.Fatal("k0 on the new server: denied, want a fresh window there")
	}
	if n := counted(t, third, "{quotad:p:k0}", l, c); n != 1 {
		t.Fatalf("k0's counter on the new server: %d, want 1", n)
	}

	// A record that cannot be found stops New, saying which.
	_, err = New(context.Background(), Config{SRV: "_memcache._tcp.missing.test", Resolver: dns.Resolver()})
	if err == nil || !strings.Contains(err.Error(), "look up SRV _memcache._tcp.missing.test") {
		t.Fatalf("a missing record: %v", err)
	}
}
