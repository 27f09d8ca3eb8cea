package redis

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// This file explains a TLS connection to a Redis that does not speak TLS:
// the handshake then gets no answer (the server waits for a command), and
// the check that Redis answers fails with a bare deadline.

// plaintextPeer reports whether addr answers a plaintext PING in RESP, and
// so is a Redis without TLS, within timeout.
func plaintextPeer(addr string, timeout time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	// +PONG, or an error reply (-NOAUTH when a password is set): RESP.
	return err == nil && (strings.HasPrefix(line, "+") || strings.HasPrefix(line, "-"))
}

// explainTLS replaces err, the failure to reach Redis over TLS through
// client, when the server answers in plaintext: TLS, not Redis, failed,
// and the error says so instead of err's bare deadline, which it still
// unwraps to.
func explainTLS(err error, client goredis.UniversalClient, timeout time.Duration) error {
	var addrs []string
	switch c := client.(type) {
	case *goredis.Client:
		if c.Options().TLSConfig == nil {
			return err
		}
		addrs = []string{c.Options().Addr}
	case *goredis.ClusterClient:
		if c.Options().TLSConfig == nil {
			return err
		}
		addrs = c.Options().Addrs
	default:
		return err
	}
	for _, a := range addrs {
		if plaintextPeer(a, timeout) {
			return tlsError{fmt.Sprintf("TLS with redis at %s failed: the handshake got no answer, and %s answers plaintext Redis commands, so it does not speak TLS; use redis:// (or --redis-tls off), or enable TLS on the server", a, a), err}
		}
	}
	return err
}

// tlsError is a failure of TLS said in words: its text is msg alone, and
// it unwraps to the error it explains.
type tlsError struct {
	msg string
	err error
}

func (e tlsError) Error() string { return e.msg }
func (e tlsError) Unwrap() error { return e.err }
