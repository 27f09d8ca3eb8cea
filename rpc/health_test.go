package rpc

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

func getHealthz(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http1Client(t).Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// gRPC health answers SERVING over real gRPC for the server and the
// service, NotFound for other services, and follows setServing, as does
// GET /healthz.
func TestHealth(t *testing.T) {
	ts := startServer(t, node.NewMemoryStore(nil, 0), Config{})
	ctx := context.Background()
	c := grpchealth.NewClient(h2cClient(t), ts.URL, connect.WithGRPC())
	status := func(service string) grpchealth.Status {
		t.Helper()
		res, err := c.Check(ctx, &grpchealth.CheckRequest{Service: service})
		if err != nil {
			t.Fatalf("check %q: %v", service, err)
		}
		return res.Status
	}
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		if got := status(service); got != grpchealth.StatusServing {
			t.Errorf("%q: %s, want SERVING", service, got)
		}
	}
	if _, err := c.Check(ctx, &grpchealth.CheckRequest{Service: "no.such.Service"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
	if code, body := getHealthz(t, ts.URL); code != http.StatusOK || body != "ok\n" {
		t.Errorf("GET /healthz: %d %q", code, body)
	}

	ts.health.setServing(false)
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		if got := status(service); got != grpchealth.StatusNotServing {
			t.Errorf("%q after setServing(false): %s", service, got)
		}
	}
	if code, _ := getHealthz(t, ts.URL); code != http.StatusServiceUnavailable {
		t.Errorf("GET /healthz when not serving: %d", code)
	}
	ts.health.setServing(true)
	if got := status(""); got != grpchealth.StatusServing {
		t.Errorf("after setServing(true): %s", got)
	}
}

// Only GET (and HEAD) /healthz exist; other methods are refused.
func TestHealthzMethod(t *testing.T) {
	ts := startServer(t, node.NewMemoryStore(nil, 0), Config{})
	res, err := http1Client(t).Post(ts.URL+"/healthz", "text/plain", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", res.StatusCode)
	}
}

// gRPC server reflection lists and describes quotad.v1.QuotaService, over
// v1 and, for older tools, v1alpha.
func TestReflection(t *testing.T) {
	ts := startServer(t, node.NewMemoryStore(nil, 0), Config{})
	// The same handler with v1 hidden: the client then falls back to
	// v1alpha (a 404 reads as Unimplemented).
	hideV1 := http.NewServeMux()
	hideV1.Handle("/"+grpcreflect.ReflectV1ServiceName+"/", http.NotFoundHandler())
	hideV1.Handle("/", ts.handler)
	v1alphaOnly := serveH2C(t, hideV1)
	for name, url := range map[string]string{"v1": ts.URL, "v1alpha": v1alphaOnly} {
		t.Run(name, func(t *testing.T) {
			stream := grpcreflect.NewClient(h2cClient(t), url, connect.WithGRPC()).NewStream(context.Background())
			defer stream.Close()
			names, err := stream.ListServices()
			if err != nil {
				t.Fatal(err)
			}
			want := map[protoreflect.FullName]bool{quotadv1connect.QuotaServiceName: false, grpchealth.HealthV1ServiceName: false}
			for _, n := range names {
				if _, ok := want[n]; ok {
					want[n] = true
				}
			}
			for n, seen := range want {
				if !seen {
					t.Errorf("ListServices %v lacks %s", names, n)
				}
			}
			files, err := stream.FileContainingSymbol(quotadv1connect.QuotaServiceName)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) == 0 || files[0].GetName() != "quotad/v1/quota.proto" {
				t.Errorf("FileContainingSymbol: %d files, first %q", len(files), files[0].GetName())
			}
		})
	}
}
