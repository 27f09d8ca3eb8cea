package cluster

import (
	"bytes"
	"io"
	"log"
	"net"
	"strconv"
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
