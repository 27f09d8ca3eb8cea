package cluster

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Each packet the transport hands memberlist is its own copy, as long as
// the packet: the read buffer it reuses neither shows through a later
// packet nor stays behind a small one.
func TestTransportPacketsAreOwnCopies(t *testing.T) {
	tr, err := newNetTransport("127.0.0.1", 0, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	ip, port, err := tr.FinalAdvertiseAddr("", 0)
	if err != nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) || port != tr.port() {
		t.Fatalf("advertise address %v:%d, %v; want 127.0.0.1:%d", ip, port, err, tr.port())
	}
	c, err := net.Dial("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := [][]byte{bytes.Repeat([]byte("a"), 1000), []byte("bb"), bytes.Repeat([]byte("c"), 300)}
	for _, p := range sent {
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	var got [][]byte
	for range sent {
		select {
		case p := <-tr.PacketCh():
			if p.From == nil || p.Timestamp.IsZero() {
				t.Errorf("packet without its sender or time: %+v", p)
			}
			got = append(got, p.Buf)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of %d packets", len(got), len(sent))
		}
	}
	for i, p := range got {
		if !bytes.Equal(p, sent[i]) {
			t.Errorf("packet %d: %.20q… (%d bytes); want %.20q… (%d bytes)", i, p, len(p), sent[i], len(sent[i]))
		}
		if cap(p) > len(sent[i])+64 {
			t.Errorf("packet %d: %d bytes in a buffer of %d", i, len(p), cap(p))
		}
	}
}

// Shutdown returns even when nobody reads the channels: memberlist.Create
// that fails before its readers start (no private IP to advertise) leaves
// New to shut the transport down, and a packet or a connection that came
// meanwhile must not hold its reader, and so New, for ever.
func TestTransportShutdownWithNobodyReading(t *testing.T) {
	tr, err := newNetTransport("127.0.0.1", 0, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.port()))
	u, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	s, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Both readers hold what they read, waiting to hand it over.
	blocked := func() bool {
		buf := make([]byte, 1<<20)
		dump := string(buf[:runtime.Stack(buf, true)])
		n := 0
		for _, g := range strings.Split(dump, "\n\n") {
			waiting := strings.Contains(g, "[chan send") || strings.Contains(g, "[select")
			if waiting && (strings.Contains(g, "(*netTransport).readPackets") || strings.Contains(g, "(*netTransport).acceptStreams")) {
				n++
			}
		}
		return n == 2
	}
	for deadline := time.Now().Add(10 * time.Second); !blocked(); {
		if time.Now().After(deadline) {
			t.Fatal("the transport's readers never took the packet and the connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	done := make(chan struct{})
	go func() { tr.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown hangs while its readers wait to hand over a packet and a connection")
	}
	// A second Shutdown (New's after a failed Create that shut it down
	// already) is harmless.
	tr.Shutdown()
}

// New that fails after it opened its transport (no node name given, and
// none to be had from the hostname) closes the transport: its readers end.
func TestNewClosesItsTransportWhenTheHostnameFails(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "", errors.New("no hostname here") }
	readers := func() int {
		buf := make([]byte, 1<<20)
		dump := string(buf[:runtime.Stack(buf, true)])
		return strings.Count(dump, "(*netTransport).readPackets") + strings.Count(dump, "(*netTransport).acceptStreams")
	}
	for deadline := time.Now().Add(10 * time.Second); readers() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("another test's transport is still reading")
		}
	}
	// A port free for TCP and UDP when probed; another process may take
	// it before New binds it, so a port found taken is tried again.
	var err error
	for range 5 {
		var m *Membership
		m, err = New(Config{BindAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freeTCPAndUDPPort(t)))}, nil)
		if err == nil {
			m.Shutdown()
			t.Fatal("New without a node name or a hostname succeeded")
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if !strings.Contains(err.Error(), "no hostname here") {
		t.Fatalf("error %q, want the hostname's", err)
	}
	for deadline := time.Now().Add(10 * time.Second); readers() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d transport readers still running after New failed: the transport was left open", readers())
		}
	}
}

// freeTCPAndUDPPort returns a loopback port that was free for both TCP
// and UDP a moment ago.
func freeTCPAndUDPPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no port free for both TCP and UDP")
	return 0
}
