package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/internal/redistest"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// dialRecorder dials the test's connections and keeps them, each noting
// when it ended: a read on it failed (the server closed it) or the client
// closed it (after a Connection: close, or a GOAWAY).
type dialRecorder struct {
	mu    sync.Mutex
	conns []*recordedConn
}

type recordedConn struct {
	net.Conn
	ended atomic.Bool
}

func (c *recordedConn) Close() error {
	c.ended.Store(true)
	return c.Conn.Close()
}

func (c *recordedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.ended.Store(true)
	}
	return n, err
}

func (d *dialRecorder) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	rc := &recordedConn{Conn: c}
	d.mu.Lock()
	d.conns = append(d.conns, rc)
	d.mu.Unlock()
	return rc, nil
}

// dials returns how many connections were dialed, and whether the first
// has ended.
func (d *dialRecorder) dials() (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns), len(d.conns) > 0 && d.conns[0].ended.Load()
}

// GRPC_MAX_CONNECTION_AGE on the built binary: on the gRPC port, a
// client's connection is ended once it is older than the age (1s here,
// ±10%), and the client's next requests succeed on a new connection, for
// each kind of connection the port serves: gRPC (grpc-go, whose GOAWAY
// grpc-go sends), HTTP/2 without TLS (net/http, the GOAWAY quotad slips
// in) and HTTP/1.1 (Connection: close on a response). Every request of
// every client is answered.
func TestEnvoyRatelimitAgesConnectionsOut(t *testing.T) {
	r := redistest.Start(t)
	p := startRatelimit(t, ratelimitRule("100000"), "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+r.Addr(),
		"GRPC_MAX_CONNECTION_AGE=1s", "GRPC_MAX_CONNECTION_AGE_GRACE=20s")
	ask := `{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}`
	httpClient := func(d *dialRecorder, h2 bool) func() error {
		protocols := new(http.Protocols)
		if h2 {
			protocols.SetUnencryptedHTTP2(true)
		} else {
			protocols.SetHTTP1(true)
		}
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: protocols,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return d.dial(ctx, addr) }}}
		return func() error {
			res, err := c.Post("http://"+p.grpcAddr+shouldRateLimitPath, "application/json", strings.NewReader(ask))
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.Contains(string(body), `"overallCode":"OK"`) {
				return &answerError{res.StatusCode, string(body)}
			}
			return nil
		}
	}
	for _, c := range []struct {
		name string
		call func(d *dialRecorder) (func() error, func())
	}{
		{"grpc", func(d *dialRecorder) (func() error, func()) {
			conn, err := grpc.NewClient("passthrough:///"+p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(d.dial))
			if err != nil {
				t.Fatal(err)
			}
			return func() error {
				code, err := shouldRateLimitOver(conn)
				if err == nil && code != rlsv3.RateLimitResponse_OK {
					return &answerError{int(code), "not OK"}
				}
				return err
			}, func() { conn.Close() }
		}},
		{"http2", func(d *dialRecorder) (func() error, func()) { return httpClient(d, true), func() {} }},
		{"http1", func(d *dialRecorder) (func() error, func()) { return httpClient(d, false), func() {} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &dialRecorder{}
			call, done := c.call(d)
			defer done()
			calls := 0
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if err := call(); err != nil {
					t.Fatalf("request %d: %v", calls+1, err)
				}
				calls++
				if n, ended := d.dials(); n >= 2 && ended {
					break
				}
				if time.Now().After(deadline) {
					n, ended := d.dials()
					t.Fatalf("after 30s and %d requests: %d connections dialed, the first ended: %v; want it ended and a second one", calls, n, ended)
				}
			}
			// The new connection serves.
			if err := call(); err != nil {
				t.Fatalf("the request after the first connection ended: %v", err)
			}
		})
	}
}

// answerError is a request answered, but not with OK.
type answerError struct {
	status int
	body   string
}

func (e *answerError) Error() string { return "answered " + http.StatusText(e.status) + ": " + e.body }
