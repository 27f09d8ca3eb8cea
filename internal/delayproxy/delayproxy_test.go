package delayproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/redistest"
)

// ping sends PING on conn and waits for +PONG, returning how long it took.
func ping(t *testing.T, conn net.Conn, r *bufio.Reader) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING answered %q, %v", line, err)
	}
	return time.Since(start)
}

// A round trip through the proxy costs at least both one-way delays; a
// stall holds the reply until it ends; pipelined requests are not
// serialised by the delay.
func TestDelayAndStall(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	conn, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	ping(t, conn, br)

	px.SetDelay(20*time.Millisecond, 30*time.Millisecond)
	if rtt := ping(t, conn, br); rtt < 50*time.Millisecond {
		t.Errorf("round trip %s, want at least 50ms", rtt)
	}

	// Ten pipelined PINGs take about one round trip, not ten.
	start := time.Now()
	for range 10 {
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if line, err := br.ReadString('\n'); err != nil || line != "+PONG\r\n" {
			t.Fatalf("%q, %v", line, err)
		}
	}
	if took := time.Since(start); took >= 500*time.Millisecond {
		t.Errorf("10 pipelined PINGs took %s: the delay serialises them", took)
	} else {
		t.Logf("10 pipelined PINGs: %s", took)
	}

	ends := px.Stall(300 * time.Millisecond)
	ping(t, conn, br)
	if early := time.Until(ends); early > 0 {
		t.Errorf("a reply came %s before the stall ended", early)
	}
}
