package guard

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// At the cap a new connection takes the place of the one idle for the
// longest, which is closed; with every connection busy the new one is
// closed instead. A nil logger discards the warnings about both.
func TestCapClosesTheLongestIdleThenRefusesWhenAllBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewConnLimiter(1, nil)
	l := NewLimitListener(ln, lim, &ResetStats{}, nil, nil)
	t.Cleanup(func() { l.Close() })
	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closed reports whether the server has closed c.
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false
		}
		return err != nil
	}

	first := dial()
	firstServed := <-conns
	defer firstServed.Close()
	if lim.Open() != 1 || lim.Idle() != 1 {
		t.Fatalf("open %d, idle %d; want 1, 1 (a connection is idle until its first request)", lim.Open(), lim.Idle())
	}
	second := dial()
	secondServed := <-conns
	defer secondServed.Close()
	if !closed(first) {
		t.Fatal("the idle connection was not closed to make room")
	}
	if lim.Open() != 1 || lim.Evicted() != 1 {
		t.Fatalf("open %d, evicted %d; want 1, 1", lim.Open(), lim.Evicted())
	}

	// The second connection is busy with a call: the next is refused.
	sc := asServerConn(secondServed)
	sc.Begin()
	third := dial()
	if !closed(third) {
		t.Fatal("a connection past the cap was not closed with every connection busy")
	}
	if lim.Refused() != 1 || lim.Open() != 1 {
		t.Fatalf("refused %d, open %d; want 1, 1", lim.Refused(), lim.Open())
	}
	// The busy connection is still served.
	if _, err := io.WriteString(second, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(secondServed, make([]byte, 1)); err != nil {
		t.Fatalf("the busy connection: %v", err)
	}
	sc.End()
	if lim.Idle() != 1 {
		t.Fatalf("idle %d after the call ended, want 1", lim.Idle())
	}
	// Closing frees the slot, once.
	secondServed.Close()
	secondServed.Close()
	if lim.Open() != 0 {
		t.Fatalf("open %d after Close, want 0", lim.Open())
	}
}
