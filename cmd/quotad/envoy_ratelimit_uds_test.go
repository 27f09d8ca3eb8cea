package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/internal/redistest"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// GRPC_UDS on the built binary serves the gRPC port on that Unix socket
// instead of GRPC_HOST:GRPC_PORT, as upstream: a grpc-go client and
// Connect's JSON over HTTP/1.1 are both answered on the socket, from the
// counters the HTTP port's /json shares (a limit of 2: the third request
// is over it), and nothing listens on the TCP port.
func TestEnvoyRatelimitServesGRPCOnAUnixSocket(t *testing.T) {
	r := redistest.Start(t)
	sock := filepath.Join(t.TempDir(), "rl.sock")
	p := startRatelimit(t, ratelimitRule("2"), "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+r.Addr(), "GRPC_UDS="+sock)
	if want := "quotad listening on unix:" + sock; !p.stdout.contains(want) {
		t.Errorf("the start does not say %q:\n%s", want, p.stdout.tail())
	}
	if !p.stderr.contains("GRPC_PORT is not needed: GRPC_UDS serves the gRPC port on " + sock) {
		t.Errorf("the start does not say GRPC_PORT is not needed:\n%s", p.stderr.tail())
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if code, err := shouldRateLimitOver(conn); err != nil || code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("gRPC on the socket: %v %v, want OK", code, err)
	}

	overSocket := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	res, err := overSocket.Post("http://localhost"+shouldRateLimitPath, "application/json",
		strings.NewReader(`{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var answer struct {
		OverallCode string `json:"overallCode"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || res.StatusCode != 200 || answer.OverallCode != "OK" {
		t.Fatalf("Connect's JSON on the socket: %d %s (%v), want 200 and OK", res.StatusCode, body, err)
	}

	if got := p.askJSON(t); got != http.StatusTooManyRequests {
		t.Errorf("the third request, on the HTTP port: %d, want 429 (the two on the socket counted)", got)
	}
	if c, err := net.DialTimeout("tcp", p.grpcAddr, 5*time.Second); err == nil {
		c.Close()
		t.Errorf("something listens on GRPC_HOST:GRPC_PORT (%s), want the socket alone", p.grpcAddr)
	}
}
