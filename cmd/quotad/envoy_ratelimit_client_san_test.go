package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/testpki"
	commonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// shouldRateLimitOver asks ShouldRateLimit for category=account of domain
// rl over conn and returns the answer's code.
func shouldRateLimitOver(conn *grpc.ClientConn) (rlsv3.RateLimitResponse_Code, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var res rlsv3.RateLimitResponse
	req := &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "category", Value: "account"}}}}}
	err := conn.Invoke(ctx, shouldRateLimitPath, req, &res)
	return res.GetOverallCode(), err
}

// GRPC_CLIENT_TLS_SAN on the built binary: over mutual TLS on the gRPC
// port, a client certificate the CA signed that carries the name is
// served; one the same CA signed for another name is refused.
func TestEnvoyRatelimitClientCertificateName(t *testing.T) {
	ca := testpki.NewCA(t, "api ca")
	server := ca.Issue(t, "quotad", true)
	dir := t.TempDir()
	r := redistest.Start(t)
	p := startRatelimit(t, ratelimitRule("10"), "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+r.Addr(),
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+writeIn(t, dir, "tls.crt", server.CertPEM),
		"GRPC_SERVER_TLS_KEY="+writeIn(t, dir, "tls.key", server.KeyPEM), "GRPC_CLIENT_TLS_CACERT="+writeIn(t, dir, "ca.pem", ca.PEM),
		"GRPC_CLIENT_TLS_SAN=envoy.internal")
	for _, c := range []struct {
		name   string
		cert   testpki.Issued
		served bool
	}{
		{"the name", ca.IssueFor(t, "envoy", false, "envoy.internal"), true},
		{"another name", ca.IssueFor(t, "envoy", false, "other.internal"), false},
	} {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsClient(ca, &c.cert))))
		if err != nil {
			t.Fatal(err)
		}
		code, err := shouldRateLimitOver(conn)
		conn.Close()
		switch {
		case c.served && (err != nil || code != rlsv3.RateLimitResponse_OK):
			t.Errorf("a client certificate with %s: %v %v, want OK", c.name, code, err)
		case !c.served && err == nil:
			t.Errorf("a client certificate with %s: served %v, want the handshake refused", c.name, code)
		}
	}
}
