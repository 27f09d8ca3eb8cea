package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/quotad/quotad/internal/quotadtest"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// Every protocol answers on the one port of a quotad binary, each from a
// stock client: Connect (HTTP/1.1 and h2c), gRPC (grpc-go's client, and
// connect-go's), gRPC-Web, HTTP/JSON, reflection v1 and v1alpha, gRPC
// health and the HTTP probes, and Envoy's rate limit service; admin calls
// need the admin token over gRPC (grpc-go's front end) as over Connect,
// and concurrency slots work over gRPC. (Over TLS and mutual TLS,
// TestTLSServesEveryProtocolAndReloadsItsCertificate and
// TestMutualTLSAndAdminToken.)
func TestEveryProtocolOnOnePort(t *testing.T) {
	cfg := writeFile(t, "q.yaml", `policies:
  - name: api
    algorithm: fixed_window
    limit: 1000
    period: 1h
  - name: jobs
    algorithm: concurrency
    limit: 1
    period: 1m
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          policy: api
`)
	token := writeFile(t, "token", "s3cret\n")
	p := startProcess(t, "--config", cfg, "--admin-token-file", token)
	addr := strings.TrimPrefix(p.URL, "http://")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2c.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := &quotadv1.CheckRequest{Policy: "api", Key: "k"}
	connectCheck := func(t *testing.T, c quotadv1connect.QuotaServiceClient) {
		t.Helper()
		res, err := c.Check(ctx, connect.NewRequest(check))
		if err != nil || !res.Msg.GetAllowed() || res.Msg.GetLimit() != 1000 {
			t.Fatalf("Check: %v, %v", res, err)
		}
	}

	t.Run("connect", func(t *testing.T) {
		connectCheck(t, quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL))
	})
	t.Run("connect over h2c", func(t *testing.T) {
		connectCheck(t, quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: h2c}, p.URL))
	})
	t.Run("grpc", func(t *testing.T) {
		res := &quotadv1.CheckResponse{}
		if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, check, res); err != nil || !res.GetAllowed() || res.GetLimit() != 1000 {
			t.Fatalf("Check: %v, %v", res, err)
		}
	})
	t.Run("grpc from connect-go", func(t *testing.T) {
		connectCheck(t, quotadv1connect.NewQuotaServiceClient(&http.Client{Transport: h2c}, p.URL, connect.WithGRPC()))
	})
	t.Run("grpc-web", func(t *testing.T) {
		connectCheck(t, quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL, connect.WithGRPCWeb()))
	})
	t.Run("http json", func(t *testing.T) {
		if got := postCheck(t, p.URL, `{"policy":"api","key":"k"}`); !*got.Allowed || got.Limit != "1000" {
			t.Fatalf("Check: %+v", got)
		}
	})
	t.Run("reflection", func(t *testing.T) {
		want := []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health", "quotad.v1.QuotaService"}
		if got := quotadtest.ReflectedServices(t, conn, "quotad.v1.QuotaService"); !slices.Equal(got, want) {
			t.Errorf("ListServices %v, want %v", got, want)
		}
	})
	t.Run("health", func(t *testing.T) {
		res, err := healthv1.NewHealthClient(conn).Check(ctx, &healthv1.HealthCheckRequest{Service: "quotad.v1.QuotaService"})
		if err != nil || res.GetStatus() != healthv1.HealthCheckResponse_SERVING {
			t.Fatalf("gRPC health: %v, %v", res, err)
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(p.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
			}
		}
	})
	t.Run("envoy rls", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{{
			Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}},
		}}}
		res := &rlsv3.RateLimitResponse{}
		if err := conn.Invoke(ctx, ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure, req, res); err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit over gRPC: %v, %v", res, err)
		}
		// And over Connect, for curl-style debugging.
		c := ratelimitv3connect.NewRateLimitServiceClient(http.DefaultClient, p.URL)
		if r, err := c.ShouldRateLimit(ctx, connect.NewRequest(req)); err != nil || r.Msg.GetStatuses()[0].GetLimitRemaining() != 998 {
			t.Fatalf("ShouldRateLimit over Connect: %v, %v", r, err)
		}
	})
	t.Run("admin token", func(t *testing.T) {
		reset := &quotadv1.ResetRequest{Policy: "api", Key: "k"}
		for _, tc := range []struct {
			md   []string
			want codes.Code
		}{
			{nil, codes.Unauthenticated},
			{[]string{"authorization", "Bearer wrong"}, codes.PermissionDenied},
			{[]string{"authorization", "Bearer s3cret"}, codes.OK},
		} {
			err := conn.Invoke(metadata.AppendToOutgoingContext(ctx, tc.md...), quotadv1connect.QuotaServiceResetProcedure, reset, &quotadv1.ResetResponse{})
			if grpcstatus.Code(err) != tc.want {
				t.Errorf("gRPC Reset with %q: %v, want %v", tc.md, err, tc.want)
			}
			req := connect.NewRequest(reset)
			if len(tc.md) > 0 {
				req.Header().Set(tc.md[0], tc.md[1])
			}
			_, err = quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL).Reset(ctx, req)
			if got := connect.CodeOf(err); err != nil && int(got) != int(tc.want) || err == nil && tc.want != codes.OK {
				t.Errorf("Connect Reset with %q: %v, want %v", tc.md, err, tc.want)
			}
		}
	})
	t.Run("slots over grpc", func(t *testing.T) {
		res := &quotadv1.CheckResponse{}
		if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, &quotadv1.CheckRequest{Policy: "jobs", Key: "j"}, res); err != nil || res.GetSlotId() == "" {
			t.Fatalf("Check of a concurrency policy: %v, %v", res, err)
		}
		slot := res.GetSlotId()
		if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceRenewSlotProcedure, &quotadv1.RenewSlotRequest{Policy: "jobs", Key: "j", SlotId: slot}, &quotadv1.RenewSlotResponse{}); err != nil {
			t.Fatalf("RenewSlot: %v", err)
		}
		if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceReleaseSlotProcedure, &quotadv1.ReleaseSlotRequest{Policy: "jobs", Key: "j", SlotId: slot}, &quotadv1.ReleaseSlotResponse{}); err != nil {
			t.Fatalf("ReleaseSlot: %v", err)
		}
		err := conn.Invoke(ctx, quotadv1connect.QuotaServiceReleaseSlotProcedure, &quotadv1.ReleaseSlotRequest{Policy: "jobs", Key: "j", SlotId: slot}, &quotadv1.ReleaseSlotResponse{})
		if grpcstatus.Code(err) != codes.NotFound {
			t.Fatalf("ReleaseSlot of a released slot: %v, want NotFound", err)
		}
	})
	t.Run("metrics see both front ends", func(t *testing.T) {
		fams := scrape(t, p.URL)
		for _, system := range []string{"grpc", "connectrpc"} {
			labels := map[string]string{"rpc_method": "quotad.v1.QuotaService/Check", "rpc_response_status_code": "OK", "rpc_system_name": system}
			if n, ok := metricValue(fams, "rpc_server_call_duration_seconds", labels); !ok || n == 0 {
				t.Errorf("rpc_server_call_duration_seconds%v = %v (present %t), want calls", labels, n, ok)
			}
		}
	})
}
