package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// hostTransport sends every request with Host host.
type hostTransport struct{ host string }

func (t hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = t.host
	return http.DefaultTransport.RoundTrip(r)
}

// getAs is GET base+path with Host host: the status and body.
func getAs(t *testing.T, base, path, host string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Transport: hostTransport{host}, Timeout: 10 * time.Second}).Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A DNS-rebinding page (a name of its own, pointed at quotad's address)
// can neither read the console, GET /status and GET /cluster nor call
// Reset on a quotad started without flags: they answer 403 (Reset
// PermissionDenied, over Connect and over gRPC alike) to a Host that is
// not localhost, a name under .localhost, an IP address quotad listens on
// or a name of --allowed-hosts, and say which flag allows it. Checks,
// /healthz, /readyz and /metrics answer any Host, as service meshes and
// scrapers need. With an admin token, the token decides Reset, whatever
// the Host.
func TestHostCheckRefusesRebindingToPagesAndAdminCalls(t *testing.T) {
	const wantMessage = "add this name to --allowed-hosts"
	p := startProcess(t)
	port := p.URL[strings.LastIndex(p.URL, ":")+1:]
	evil := "rebind.example:" + port
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reset := func(t *testing.T, base, host, token string) error {
		t.Helper()
		req := connect.NewRequest(&quotadv1.ResetRequest{Policy: "p", Key: "k"})
		if token != "" {
			req.Header().Set("Authorization", "Bearer "+token)
		}
		_, err := quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: hostTransport{host}}, base).Reset(ctx, req)
		return err
	}
	grpcReset := func(t *testing.T, base, authority, token string) error {
		t.Helper()
		conn, err := grpc.NewClient(strings.TrimPrefix(base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(authority))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		callCtx := ctx
		if token != "" {
			callCtx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		return conn.Invoke(callCtx, quotadv1connect.QuotaServiceResetProcedure, &quotadv1.ResetRequest{Policy: "p", Key: "k"}, &quotadv1.ResetResponse{})
	}

	t.Run("a rebinding Host is refused", func(t *testing.T) {
		for _, path := range []string{"/status", "/cluster", "/", "/console/"} {
			code, body := getAs(t, p.URL, path, evil)
			if code != http.StatusForbidden || !strings.Contains(body, wantMessage) {
				t.Errorf("GET %s with Host %s: %d %q, want 403 saying %q", path, evil, code, body, wantMessage)
			}
		}
		if err := reset(t, p.URL, evil, ""); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), wantMessage) {
			t.Errorf("Reset over Connect with Host %s: %v, want PermissionDenied saying %q", evil, err, wantMessage)
		}
		if err := grpcReset(t, p.URL, evil, ""); grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), wantMessage) {
			t.Errorf("Reset over gRPC with :authority %s: %v, want PermissionDenied saying %q", evil, err, wantMessage)
		}
		code, body := getAs(t, p.URL, "/status", evil)
		t.Logf("GET /status with Host %s: %d %s", evil, code, strings.TrimSpace(body))
	})
	t.Run("the loopback's names and addresses are served", func(t *testing.T) {
		for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "quotad.localhost:" + port, "LOCALHOST.:" + port} {
			for _, path := range []string{"/status", "/cluster", "/"} {
				if code, body := getAs(t, p.URL, path, host); code != http.StatusOK {
					t.Errorf("GET %s with Host %s: %d %q", path, host, code, body)
				}
			}
			if err := reset(t, p.URL, host, ""); err != nil {
				t.Errorf("Reset over Connect with Host %s: %v", host, err)
			}
		}
		if err := grpcReset(t, p.URL, "localhost:"+port, ""); err != nil {
			t.Errorf("Reset over gRPC with :authority localhost: %v", err)
		}
	})
	t.Run("checks and probes answer any Host", func(t *testing.T) {
		c := quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: hostTransport{evil}}, p.URL)
		if res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "p", Key: "k", Limit: fw5JSON()})); err != nil || !res.Msg.GetAllowed() {
			t.Errorf("Check with Host %s: %v, %v", evil, res, err)
		}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			if code, body := getAs(t, p.URL, path, evil); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d %q", path, evil, code, body)
			}
		}
	})
	t.Run("allowed hosts", func(t *testing.T) {
		q := startProcess(t, "--allowed-hosts", "quotad.example,quotad.ns.svc")
		qport := q.URL[strings.LastIndex(q.URL, ":")+1:]
		if code, body := getAs(t, q.URL, "/status", "quotad.ns.svc:"+qport); code != http.StatusOK {
			t.Errorf("GET /status with an allowed Host: %d %q", code, body)
		}
		if err := reset(t, q.URL, "quotad.example", ""); err != nil {
			t.Errorf("Reset with an allowed Host: %v", err)
		}
		if code, _ := getAs(t, q.URL, "/status", "rebind.example"); code != http.StatusForbidden {
			t.Errorf("GET /status with a Host not allowed: %d, want 403", code)
		}
		all := startProcess(t, "--allowed-hosts", "*")
		if code, body := getAs(t, all.URL, "/status", "rebind.example"); code != http.StatusOK {
			t.Errorf("GET /status with --allowed-hosts '*': %d %q", code, body)
		}
	})
	t.Run("with an admin token the token decides", func(t *testing.T) {
		q := startProcess(t, "--admin-token-file", writeFile(t, "token", "tok3n\n"))
		if err := reset(t, q.URL, "rebind.example", "tok3n"); err != nil {
			t.Errorf("Reset with the token and any Host: %v", err)
		}
		if err := grpcReset(t, q.URL, "rebind.example", "tok3n"); err != nil {
			t.Errorf("gRPC Reset with the token and any Host: %v", err)
		}
		if err := reset(t, q.URL, "localhost", ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("Reset without the token from localhost: %v, want Unauthenticated", err)
		}
		if code, _ := getAs(t, q.URL, "/status", "rebind.example"); code != http.StatusForbidden {
			t.Errorf("GET /status with a Host not allowed, admin token set: %d, want 403", code)
		}
	})
}

// GET /status (and so the console) shows the keys denied most as a
// SHA-256 prefix by default, never the keys themselves (often a user, an
// IP address or an API key); --console-show-keys opts in to the keys.
func TestStatusHidesKeysByDefault(t *testing.T) {
	const key = "alice@example.com"
	status := func(t *testing.T, args ...string) string {
		t.Helper()
		p := startProcess(t, args...)
		c := quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL)
		lim := fw5JSON()
		lim.Limit = 1
		for range 3 {
			if _, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "login", Key: key, Limit: lim})); err != nil {
				t.Fatal(err)
			}
		}
		code, body := getAs(t, p.URL, "/status", "localhost")
		if code != http.StatusOK {
			t.Fatalf("GET /status: %d %s", code, body)
		}
		return body
	}
	if body := status(t); strings.Contains(body, key) || !strings.Contains(body, `"keys": "sha256"`) || !strings.Contains(body, `"key": "sha256:`) {
		t.Errorf("by default /status shows the key, or no hash of it:\n%s", body)
	}
	if body := status(t, "--console-show-keys"); !strings.Contains(body, `"key": "`+key+`"`) || !strings.Contains(body, `"keys": "shown"`) {
		t.Errorf("with --console-show-keys /status does not show the key:\n%s", body)
	}
}
