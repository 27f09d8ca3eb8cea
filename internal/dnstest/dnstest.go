// Package dnstest serves DNS SRV records from a real UDP server on a free
// loopback port, for tests of code that looks servers up in DNS, and gives
// the net.Resolver that asks it.
package dnstest

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers SRV questions with the records set for their name, and
// NXDOMAIN for a name it holds none for. It stops when the test ends.
type Server struct {
	conn net.PacketConn

	mu      sync.Mutex
	records map[string][]net.SRV // by fully qualified name, lower case
	asked   int
}

// Start serves on a free 127.0.0.1 UDP port.
func Start(t testing.TB) *Server {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("dnstest: %v", err)
	}
	s := &Server{conn: conn, records: map[string][]net.SRV{}}
	done := make(chan struct{})
	go func() { defer close(done); s.serve() }()
	t.Cleanup(func() { conn.Close(); <-done })
	return s
}

// Set makes name (e.g. "_memcache._tcp.example.") answer with records,
// in their order; none makes it NXDOMAIN.
func (s *Server) Set(name string, records ...net.SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records[fqdn(name)] = records
}

// Asked is how many SRV questions the server answered.
func (s *Server) Asked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked
}

// Resolver is a resolver that asks only this server.
func (s *Server) Resolver() *net.Resolver {
	addr := s.conn.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply, ok := s.answer(buf[:n]); ok {
			_, _ = s.conn.WriteTo(reply, from)
		}
	}
}

// answer builds the reply to one query: its SRV records, or NXDOMAIN; an
// empty answer to any other type.
func (s *Server) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	s.mu.Lock()
	records, known := s.records[strings.ToLower(q.Name.String())]
	if q.Type == dnsmessage.TypeSRV {
		s.asked++
	}
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known || len(records) == 0 {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if q.Type == dnsmessage.TypeSRV {
		for _, r := range records {
			target, err := dnsmessage.NewName(fqdn(r.Target))
			if err != nil {
				return nil, false
			}
			rr := dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: target}
			if b.SRVResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, rr) != nil {
				return nil, false
			}
		}
	}
	reply, err := b.Finish()
	return reply, err == nil
}
