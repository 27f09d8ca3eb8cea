package rpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// selfSigned is a certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "quotad test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// With srv.TLSConfig set, the split happens after TLS: gRPC (ALPN h2) on
// grpc-go, Connect over HTTP/2 and JSON over HTTP/1.1 on net/http, all on
// one TLS port.
func TestServerOverTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	h := memoryHandler(t)
	var httpProtos []int
	protos := make(chan int, 16)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos <- r.ProtoMajor
		h.ServeHTTP(w, r)
	})
	// No NextProtos: the server offers h2 and http/1.1 itself.
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	_, addr := serveServerAPI(t, h, api, ServerConfig{TLS: tc})
	base := "https://" + addr
	ctx := context.Background()
	req := &quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: fw5()}
	clientTLS := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	// gRPC with grpc-go's client: ALPN h2, served by grpc-go.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res := &quotadv1.CheckResponse{}
	if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, req, res); err != nil || !res.GetAllowed() {
		t.Fatalf("gRPC over TLS: %v, %v", res, err)
	}

	// Connect over HTTP/2 (ALPN h2) and JSON over HTTP/1.1, served by
	// net/http.
	h2 := &http.Transport{TLSClientConfig: clientTLS, ForceAttemptHTTP2: true}
	h1 := &http.Transport{TLSClientConfig: clientTLS, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	defer h2.CloseIdleConnections()
	defer h1.CloseIdleConnections()
	c := quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: h2}, base)
	if r, err := c.Check(ctx, connect.NewRequest(req)); err != nil || !r.Msg.GetAllowed() {
		t.Fatalf("Connect over TLS h2: %v, %v", r, err)
	}
	web := quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: h2}, base, connect.WithGRPCWeb())
	if r, err := web.Check(ctx, connect.NewRequest(req)); err != nil || !r.Msg.GetAllowed() {
		t.Fatalf("gRPC-Web over TLS h2: %v, %v", r, err)
	}
	resp, err := (&http.Client{Transport: h1}).Post(base+quotadv1connect.QuotaServiceCheckProcedure, "application/json",
		strings.NewReader(`{"policy":"demo","key":"k","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Fatalf("JSON over TLS HTTP/1.1: %d over HTTP/%d", resp.StatusCode, resp.ProtoMajor)
	}
	close(protos)
	for p := range protos {
		httpProtos = append(httpProtos, p)
	}
	// Connect and gRPC-Web over h2, JSON over HTTP/1.1; gRPC never
	// reached net/http.
	if len(httpProtos) != 3 || httpProtos[0] != 2 || httpProtos[1] != 2 || httpProtos[2] != 1 {
		t.Fatalf("the HTTP front end served HTTP/%v, want [2 2 1]", httpProtos)
	}
	// Plain text on the TLS port is refused: nothing speaks cleartext.
	plain := quotadv1connect.NewQuotaServiceClient(http1Client(t), "http://"+addr)
	if _, err := plain.Check(ctx, connect.NewRequest(req)); err == nil {
		t.Fatal("a cleartext request was served on the TLS port")
	}
}
