package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotad/quotad/internal/testpki"
	commonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// secretDir lays out files the way Kubernetes mounts a Secret: each name
// is a symlink into ..data, itself a symlink to a timestamped directory,
// and an update swaps ..data in one rename.
type secretDir struct {
	dir     string
	version int
}

func newSecretDir(t *testing.T, files map[string][]byte) *secretDir {
	t.Helper()
	s := &secretDir{dir: t.TempDir()}
	s.update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(s.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *secretDir) path(name string) string { return filepath.Join(s.dir, name) }

// update writes files into a new version directory and points ..data at
// it atomically, as the kubelet does.
func (s *secretDir) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	s.version++
	v := filepath.Join(s.dir, "..v"+strings.Repeat("i", s.version))
	if err := os.Mkdir(v, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(v, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(v), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// ---- clients of every protocol ----

const tlsTestConfig = `policies:
  - {name: api, algorithm: fixed_window, limit: 1000, period: 1m}
envoy:
  domains:
    - domain: edge
      descriptors:
        - {key: remote_address, policy: api}
`

// tlsClient is the client side of one TLS setup: the roots that trust
// quotad's CA and, for mutual TLS, a client certificate.
func tlsClient(ca *testpki.CA, cert *testpki.Issued) *tls.Config {
	tc := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		tc.Certificates = []tls.Certificate{cert.Pair}
	}
	return tc
}

// callAll makes one call over each protocol quotad serves on its port and
// returns the first error: Connect (quotadclient, over HTTP/2 by ALPN),
// gRPC-Web (quotadclient), gRPC and Envoy's rate limit service (grpc-go
// clients), and HTTP/JSON (net/http over HTTP/1.1).
func callAll(t *testing.T, base string, tc *tls.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range []quotadclient.Protocol{quotadclient.ProtocolConnect, quotadclient.ProtocolGRPCWeb} {
		c, err := quotadclient.New(base, quotadclient.Options{Protocol: p, TLSConfig: tc})
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.Check(ctx, "api", "k-"+p.String(), 1)
		c.Close()
		if err != nil {
			return err
		}
		if !d.Allowed {
			t.Errorf("%s: denied: %+v", p, d)
		}
	}

	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var res quotadv1.CheckResponse
	if err := conn.Invoke(ctx, "/quotad.v1.QuotaService/Check", &quotadv1.CheckRequest{Policy: "api", Key: "k-grpc"}, &res); err != nil {
		return err
	}
	if !res.GetAllowed() {
		t.Errorf("gRPC: denied: %v", &res)
	}
	// Envoy's method over grpc-go, with the wire-compatible messages (this
	// test binary links quotad's trimmed copy, so not go-control-plane's;
	// internal/envoycompat runs go-control-plane's own client).
	rls := &rlsv3.RateLimitResponse{}
	if err := conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}}},
	}}, rls); err != nil {
		return err
	}
	if rls.GetOverallCode() != rlsv3.RateLimitResponse_OK || rls.GetStatuses()[0].GetCurrentLimit().GetName() != "api" {
		t.Errorf("Envoy RLS: %v", rls)
	}

	// HTTP/JSON over HTTP/1.1: a transport with a TLS config and no
	// ForceAttemptHTTP2 offers only http/1.1 by ALPN.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.Clone()}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/quotad.v1.QuotaService/Check", strings.NewReader(`{"policy":"api","key":"k-json"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got checkJSON
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Allowed == nil || !*got.Allowed {
		t.Errorf("HTTP/JSON: %s %s", resp.Status, body)
	}
	if resp.Proto != "HTTP/1.1" {
		t.Errorf("HTTP/JSON client without h2 got %s", resp.Proto)
	}
	return nil
}

// negotiated dials quotad and returns the ALPN protocol and the serial
// number of the certificate it presents.
func negotiated(t *testing.T, base string, tc *tls.Config) (string, *big.Int) {
	t.Helper()
	u, _ := url.Parse(base)
	tc = tc.Clone()
	tc.NextProtos = []string{"h2", "http/1.1"}
	conn, err := tls.Dial("tcp", u.Host, tc)
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer conn.Close()
	st := conn.ConnectionState()
	return st.NegotiatedProtocol, st.PeerCertificates[0].SerialNumber
}

// firstRead opens a TLS connection to quotad, sends an HTTP/1.1 request
// and returns the error of reading its answer, if any.
func firstRead(base string, tc *tls.Config) error {
	u, _ := url.Parse(base)
	conn, err := tls.Dial("tcp", u.Host, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: quotad\r\n\r\n"); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

// ---- the tests ----

// A built quotad with --tls-cert-file and --tls-key-file serves every
// protocol over TLS on its one port (HTTP/2 by ALPN, HTTP/1.1 too), and
// nothing in cleartext. A certificate replaced on disk, the way Kubernetes
// updates a Secret, is served on new connections.
func TestTLSServesEveryProtocolAndReloadsItsCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "quotad test CA")
	first := ca.Issue(t, "quotad-1", true)
	secret := newSecretDir(t, map[string][]byte{"tls.crt": first.CertPEM, "tls.key": first.KeyPEM})
	p := startProcess(t, "--config", writeFile(t, "q.yaml", tlsTestConfig),
		"--tls-cert-file", secret.path("tls.crt"), "--tls-key-file", secret.path("tls.key"))
	if !strings.HasPrefix(p.URL, "https://") {
		t.Fatalf("quotad says it listens on %s, want https://", p.URL)
	}
	tc := tlsClient(ca, nil)
	if err := callAll(t, p.URL, tc); err != nil {
		t.Fatalf("over TLS: %v\n%s", err, p.stderr.tail())
	}
	if proto, got := negotiated(t, p.URL, tc); proto != "h2" || got.Cmp(first.Serial) != 0 {
		t.Errorf("ALPN %q, certificate serial %v; want h2 and %v", proto, got, first.Serial)
	}

	// Cleartext is refused: HTTP/1.1 gets net/http's 400, and a client
	// that does not trust quotad's CA fails the handshake.
	resp, err := http.Get("http://" + strings.TrimPrefix(p.URL, "https://") + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("cleartext GET /healthz on the TLS port: %s", resp.Status)
		}
	}
	if _, err := (&http.Client{Transport: &http.Transport{}}).Get(p.URL + "/healthz"); err == nil {
		t.Error("a client without quotad's CA in its roots got an answer")
	}

	// The kubelet swaps the Secret's ..data symlink: the next handshake
	// presents the new certificate, with no restart.
	second := ca.Issue(t, "quotad-2", true)
	secret.update(t, map[string][]byte{"tls.crt": second.CertPEM, "tls.key": second.KeyPEM})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, got := negotiated(t, p.URL, tc)
		if got.Cmp(second.Serial) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving serial %v 10s after the swap, want %v\n%s", got, second.Serial, p.stderr.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := callAll(t, p.URL, tc); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	if !strings.Contains(p.stderr.tail(), "certificate reloaded") {
		t.Errorf("no reload in the log:\n%s", p.stderr.tail())
	}

	// A half-written update (a key that does not match the certificate)
	// is not applied: the last good certificate is still served.
	third := ca.Issue(t, "quotad-3", true)
	secret.update(t, map[string][]byte{"tls.crt": third.CertPEM, "tls.key": first.KeyPEM})
	// quotad notices the change on a later handshake or its poll, as with
	// the good update above: until it has logged the refusal, every
	// handshake must still get the previous certificate.
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.tail(), "do not load") {
		if _, got := negotiated(t, p.URL, tc); got.Cmp(second.Serial) != 0 {
			t.Fatalf("after a mismatched update: serial %v, want the previous %v", got, second.Serial)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mismatched update was not logged within 10s:\n%s", p.stderr.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, got := negotiated(t, p.URL, tc); got.Cmp(second.Serial) != 0 {
		t.Errorf("after the mismatched update was refused: serial %v, want the previous %v", got, second.Serial)
	}
}

// With --tls-client-ca-file every protocol works with a client
// certificate the CA signed, and a client without one, or with one from
// another CA, is refused. Reset needs the admin token: refused without it
// (Unauthenticated) or with another (PermissionDenied), done with it, from
// quotadclient, grpc-go and quotad check.
func TestMutualTLSAndAdminToken(t *testing.T) {
	ca := testpki.NewCA(t, "quotad test CA")
	server := ca.Issue(t, "quotad", true)
	client := ca.Issue(t, "client", false)
	stranger := testpki.NewCA(t, "another CA").Issue(t, "stranger", false)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const token = "s3cret-admin-token"
	tokenFile := write("token", []byte(token+"\n"))
	p := startProcess(t, "--config", writeFile(t, "q.yaml", tlsTestConfig),
		"--tls-cert-file", write("tls.crt", server.CertPEM), "--tls-key-file", write("tls.key", server.KeyPEM),
		"--tls-client-ca-file", write("ca.crt", ca.PEM), "--admin-token-file", tokenFile)

	if err := callAll(t, p.URL, tlsClient(ca, &client)); err != nil {
		t.Fatalf("with a client certificate: %v\n%s", err, p.stderr.tail())
	}
	for name, tc := range map[string]*tls.Config{"no client certificate": tlsClient(ca, nil), "another CA's certificate": tlsClient(ca, &stranger)} {
		if err := callAll(t, p.URL, tc); err == nil {
			t.Errorf("%s: quotad answered", name)
		}
		// Under TLS 1.3 the refusal is an alert that arrives after the
		// client's side of the handshake, on the first read; each client
		// above words it its own way, the alert itself names the problem.
		if err := firstRead(p.URL, tc); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: first read %v, want a certificate alert", name, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reset := func(tok string) error {
		c, err := quotadclient.New(p.URL, quotadclient.Options{TLSConfig: tlsClient(ca, &client), AdminToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.Reset(ctx, "api", "k")
	}
	if err := reset(""); connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "Authorization: Bearer") {
		t.Errorf("Reset without a token: %v, want Unauthenticated naming the header", err)
	}
	if err := reset("guess"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("Reset with a wrong token: %v, want PermissionDenied", err)
	}
	if err := reset(token); err != nil {
		t.Errorf("Reset with the token: %v", err)
	}
	if !strings.Contains(p.stderr.tail(), "admin call refused") {
		t.Errorf("refusals are not logged:\n%s", p.stderr.tail())
	}

	// gRPC clients send the token as metadata.
	u, _ := url.Parse(p.URL)
	conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(credentials.NewTLS(tlsClient(ca, &client))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	grpcReset := func(md ...string) error {
		return conn.Invoke(metadata.AppendToOutgoingContext(ctx, md...), "/quotad.v1.QuotaService/Reset", &quotadv1.ResetRequest{Policy: "api", Key: "k"}, &quotadv1.ResetResponse{})
	}
	if err := grpcReset(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC Reset without a token: %v", err)
	}
	if err := grpcReset("authorization", "Bearer "+token); err != nil {
		t.Errorf("gRPC Reset with the token: %v", err)
	}

	// quotad check --reset, over mutual TLS, with and without the token.
	certs := []string{"--addr", p.URL, "--tls-ca-file", filepath.Join(dir, "ca.crt"),
		"--tls-cert-file", write("client.crt", client.CertPEM), "--tls-key-file", write("client.key", client.KeyPEM)}
	if code, out, errOut := runCheck(t, append(certs, "--policy", "api", "--key", "k")...); code != checkAllowed || !strings.HasPrefix(out, "allowed") {
		t.Errorf("quotad check over mutual TLS: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := runCheck(t, append(certs, "--reset", "--policy", "api", "--key", "k")...); code != checkFailed || !strings.Contains(errOut, "unauthenticated") {
		t.Errorf("quotad check --reset without a token: exit %d, %q", code, errOut)
	}
	if code, out, errOut := runCheck(t, append(certs, "--reset", "--admin-token-file", tokenFile, "--policy", "api", "--key", "k")...); code != checkAllowed || !strings.HasPrefix(out, "reset") {
		t.Errorf("quotad check --reset with the token: exit %d, %q %q", code, out, errOut)
	}
}

// The TLS settings come from flags, environment and the file like every
// other, and bad files stop quotad at start with an error naming them.
func TestTLSSettings(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	server := ca.Issue(t, "quotad", true)
	crt := writeFile(t, "tls.crt", string(server.CertPEM))
	key := writeFile(t, "tls.key", string(server.KeyPEM))
	caFile := writeFile(t, "ca.crt", string(ca.PEM))
	tok := writeFile(t, "token", "t0ken\n")
	file := writeFile(t, "q.yaml", "tls:\n  cert_file: "+crt+"\n  key_file: "+key+"\nadmin_token_file: "+tok+"\n")
	c, err := loadConfig([]string{"--config", file}, func(k string) string {
		return map[string]string{"QUOTAD_TLS_CLIENT_CA_FILE": caFile}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS != (tlsConfig{CertFile: crt, KeyFile: key, ClientCAFile: caFile}) || c.AdminTokenFile != tok {
		t.Errorf("tls %+v, admin token file %q", c.TLS, c.AdminTokenFile)
	}
	if got, err := readAdminToken(tok); got != "t0ken" || err != nil {
		t.Errorf("token %q, %v", got, err)
	}

	notPEM := writeFile(t, "junk", "junk")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"cert without key", []string{"--tls-cert-file", crt}, []string{"--tls-cert-file and --tls-key-file"}},
		{"client CA without cert", []string{"--tls-client-ca-file", caFile}, []string{"--tls-client-ca-file needs --tls-cert-file"}},
		{"missing cert", []string{"--tls-cert-file", "/nonexistent/tls.crt", "--tls-key-file", key}, []string{"/nonexistent/tls.crt"}},
		{"key of another cert", []string{"--tls-cert-file", crt, "--tls-key-file", writeFile(t, "other.key", string(ca.Issue(t, "x", true).KeyPEM))}, []string{"tls", "private key does not match"}},
		{"client CA not PEM", []string{"--tls-cert-file", crt, "--tls-key-file", key, "--tls-client-ca-file", notPEM}, []string{"client CA file", "no PEM certificate"}},
		{"empty token", []string{"--admin-token-file", writeFile(t, "empty", "\n")}, []string{"admin token file", "empty"}},
		{"missing token", []string{"--admin-token-file", "/nonexistent/token"}, []string{"admin token file", "/nonexistent/token"}},
		{"token with a space", []string{"--admin-token-file", writeFile(t, "spaced", "two words")}, []string{"admin token", "without spaces"}},
		{"unknown tls field", []string{"--config", writeFile(t, "bad.yaml", "tls:\n  cert: x\n")}, []string{"line 2", "tls.cert: unknown field in tls (known: cert_file, key_file, client_ca_file, client_san)"}},
		{"client SAN without client CA", []string{"--tls-cert-file", crt, "--tls-key-file", key, "--tls-client-san", "edge.internal"}, []string{"tls: --tls-client-san edge.internal needs --tls-client-ca-file"}},
		{"client SAN alone", []string{"--tls-client-san", "edge.internal"}, []string{"tls: --tls-client-san edge.internal needs --tls-client-ca-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(tc.args, func(string) string { return "" }, io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// quotad check's new flags refuse bad combinations before any call.
func TestCheckResetAndTLSFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reset", "--cost", "2"}, "--reset takes --policy and --key only"},
		{[]string{"--reset", "--json"}, "--reset takes --policy and --key only"},
		{[]string{"--tls-cert-file", "c.pem"}, "--tls-cert-file and --tls-key-file go together"},
		{[]string{"--tls-ca-file", "/nonexistent/ca.PEM"}, "--tls-ca-file"},
		{[]string{"--admin-token-file", "/nonexistent/token"}, "--admin-token-file"},
	} {
		code, out, errOut := runCheck(t, append([]string{"--policy", "api", "--key", "k"}, tc.args...)...)
		if code != checkFailed || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q %q; want 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
