package rpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotad/quotad/internal/attack"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Tests that the gRPC front end (grpc-go) treats a call as the HTTP front
// end (connect-go) does, beyond what the package's other tests already run
// over both (they use connect-go's gRPC client, which the split sends to
// grpc-go: admin token, slots, SetRules, errors).

// An all-or-nothing batch answers the same over both front ends.
func TestAllOrNothingOverBothFrontEnds(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "per-user", Limit: fiveAYear})
	ctx := context.Background()
	type answer struct {
		code    connect.Code
		message string
		left    []int64
	}
	answers := map[string]answer{}
	for _, protocol := range []string{"connect", "grpc"} {
		c := ts.client(t, protocol)
		key := "u-" + protocol
		bad, err := c.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: []*quotadv1.CheckRequest{
			{Policy: "per-user", Key: key}, {Policy: "per-user", Key: ""},
		}}))
		if err == nil {
			t.Fatalf("%s: a batch with an empty key: %v", protocol, bad)
		}
		good, err2 := c.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: []*quotadv1.CheckRequest{
			{Policy: "per-user", Key: key}, {Policy: "per-user", Key: key, Cost: cost(2)},
		}}))
		if err2 != nil {
			t.Fatalf("%s: %v", protocol, err2)
		}
		var left []int64
		for _, r := range good.Msg.GetResults() {
			left = append(left, r.GetResponse().GetRemaining())
		}
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%s: %v is not a connect error", protocol, err)
		}
		answers[protocol] = answer{ce.Code(), ce.Message(), left}
	}
	c, g := answers["connect"], answers["grpc"]
	if c.code != connect.CodeInvalidArgument || !strings.HasPrefix(c.message, "requests[1]: key:") {
		t.Errorf("connect: %v %q, want InvalidArgument naming requests[1]", c.code, c.message)
	}
	if c.code != g.code || c.message != g.message || len(g.left) != 2 || c.left[0] != g.left[0] || c.left[1] != g.left[1] {
		t.Errorf("connect answered %+v, grpc %+v", c, g)
	}
}

// A gRPC connection counts in MaxConnections, and is busy while a call is
// in flight on it: at the cap, a new connection takes the place of an idle
// gRPC connection, never of one with an open stream.
func TestConnectionCapCountsGRPC(t *testing.T) {
	n, err := node.New(node.Config{Policies: []node.Policy{{Name: "p", Limit: fiveAYear}}}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	health := NewHealth(n)
	h, err := NewHandler(n, Config{Health: health}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, addr := serveServer(t, h, ServerConfig{MaxConnections: 2})
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// busy holds a health Watch open; idle makes one call and rests.
	busy := dial()
	watch, err := healthv1.NewHealthClient(busy).Watch(ctx, &healthv1.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := watch.Recv(); err != nil || res.GetStatus() != healthv1.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v, %v", res, err)
	}
	idle := dial()
	if err := idle.Invoke(ctx, "/quotad.v1.QuotaService/Check", &quotadv1.CheckRequest{Policy: "p", Key: "k"}, &quotadv1.CheckResponse{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two connections open, one of them idle", func() bool {
		return s.conns.Open() == 2 && s.conns.Idle() == 1
	})

	// A third connection, over HTTP/1.1, evicts the idle gRPC one.
	resp, err := http1Client(t).Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if st := s.Stats(); st.Evicted != 1 || st.Refused != 0 || st.Open != 2 {
		t.Fatalf("stats %+v, want 1 evicted, 2 open", st)
	}
	// The busy connection's stream lives on: it sees the next change.
	health.Drain()
	if res, err := watch.Recv(); err != nil || res.GetStatus() != healthv1.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after the eviction: %v, %v", res, err)
	}
}

// serveServer serves h with NewServer's server configured by cfg on a
// fresh loopback port until the test ends.
func serveServer(t *testing.T, h *Handler, cfg ServerConfig) (*Server, string) {
	t.Helper()
	return serveServerAPI(t, h, h, cfg)
}

// serveServerAPI is serveServer with api as the HTTP front end's handler
// (NewServer's api).
func serveServerAPI(t *testing.T, h *Handler, api http.Handler, cfg ServerConfig) (*Server, string) {
	t.Helper()
	s, err := NewServer(h, api, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return s, ln.Addr().String()
}

// waitFor polls cond until it holds, or fails the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client that resets its gRPC streams in bulk gets the guard's GOAWAY on
// grpc-go's transport too, in cleartext and inside TLS.
func TestRapidResetOnTheGRPCFrontEnd(t *testing.T) {
	h := memoryHandler(t)
	cert, pool := selfSigned(t)
	for _, useTLS := range []bool{false, true} {
		name := map[bool]string{false: "h2c", true: "tls"}[useTLS]
		t.Run(name, func(t *testing.T) {
			cfg := ServerConfig{}
			if useTLS {
				cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			}
			s, addr := serveServer(t, h, cfg)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			if useTLS {
				tc := tls.Client(c, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}, ServerName: "127.0.0.1"})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tc
			}
			if err := attack.StartH2C(c); err != nil {
				t.Fatal(err)
			}
			goaway := make(chan attack.Frame, 1)
			go func() {
				defer close(goaway)
				_ = c.SetReadDeadline(time.Now().Add(time.Minute))
				for {
					f, err := attack.ReadFrame(c)
					if err != nil {
						return
					}
					if f.Type == attack.FrameGoAway {
						goaway <- f
						return
					}
				}
			}()
			block := grpcCheckHeaders(t)
			w := bufio.NewWriter(c)
			const pairs = 2000
			for i := range pairs {
				id := uint32(2*i + 1)
				_ = attack.WriteFrame(w, attack.FrameHeaders, attack.FlagEndHeaders, id, block)
				_ = attack.WriteFrame(w, attack.FrameRSTStream, 0, id, []byte{0, 0, 0, 8}) // CANCEL
			}
			_ = w.Flush() // may fail once the server has closed
			f, ok := <-goaway
			if !ok {
				t.Fatal("no GOAWAY")
			}
			// grpc-go's own GOAWAYs carry other codes (NO_ERROR on
			// shutdown, ENHANCE_YOUR_CALM with "too_many_pings").
			if code := binary.BigEndian.Uint32(f.Payload[4:8]); code != uint32(http2.ErrCodeEnhanceYourCalm) || !bytes.Equal(f.Payload[8:], []byte("too many stream resets")) {
				t.Fatalf("GOAWAY code %d %q, want the guard's ENHANCE_YOUR_CALM", code, f.Payload[8:])
			}
			if st := s.Stats(); st.ResetGoAways != 1 {
				t.Fatalf("stats %+v, want 1 reset GOAWAY", st)
			}
		})
	}
}

// grpcCheckHeaders is an HPACK block of a gRPC Check request's headers,
// as the first of a connection (empty dynamic table).
func grpcCheckHeaders(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/quotad.v1.QuotaService/Check"}, {Name: ":authority", Value: "quotad"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		// Never indexed: every request's block stands alone, as the
		// attack repeats the same bytes.
		f.Sensitive = true
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}
