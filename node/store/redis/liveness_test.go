package redis

import (
	"bufio"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

// watchedTo opens a connection to addr watched by l, as the store's
// clients' connections are.
func watchedTo(t *testing.T, l *liveness, addr string) net.Conn {
	t.Helper()
	conn, err := dialHook{l}.DialHook(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	})(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A reply that came but was not read (the process too busy to run the
// reader) is Redis answering: no stall, however long it waits unread. A
// command left unanswered (Redis stalled) is a stall once it has waited
// the given time, and no longer once its reply is read.
func TestLivenessTellsAnUnreadReplyFromASilentRedis(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	l := newLiveness()
	defer l.close()
	conn := watchedTo(t, l, px.Addr())
	const d = 20 * time.Millisecond

	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !conn.(watchedSyscallConn).replyWaiting() {
		if time.Now().After(deadline) {
			t.Fatal("no reply waiting after 5s")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * d)
	if l.stalled(d) {
		t.Fatal("a reply waiting unread counts as Redis not answering")
	}
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("reply %q, %v", line, err)
	}

	px.Stall(time.Second) // ends before the proxy closes, which waits for it
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if l.stalled(d) {
		t.Fatal("a command written just now counts as a stall")
	}
	time.Sleep(2 * d)
	if !l.stalled(d) {
		t.Fatalf("a command unanswered for %s does not count as a stall", 2*d)
	}
	if err := l.missed(2 * d); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a missed deadline while Redis is silent: %v, want a plain deadline", err)
	}
	conn.Close()
	if l.stalled(d) {
		t.Fatal("a closed connection still counts")
	}
	if err := l.missed(2 * d); !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a missed deadline with nothing unanswered: %v, want node.ErrOverloaded", err)
	}
}
