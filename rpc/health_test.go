package rpc

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

func getPage(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http1Client(t).Get(url)
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

// grpcStatus asks gRPC health about service over real gRPC.
func grpcStatus(t *testing.T, url, service string) grpchealth.Status {
	t.Helper()
	c := grpchealth.NewClient(h2cClient(t), url, connect.WithGRPC())
	res, err := c.Check(context.Background(), &grpchealth.CheckRequest{Service: service})
	if err != nil {
		t.Fatalf("check %q: %v", service, err)
	}
	return res.Status
}

// gRPC health answers SERVING over real gRPC for the server and the
// service, NotFound for other services; a drain turns both and /readyz to
// not serving while /healthz (liveness) stays 200.
func TestHealthAndDrain(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		if got := grpcStatus(t, ts.URL, service); got != grpchealth.StatusServing {
			t.Errorf("%q: %s, want SERVING", service, got)
		}
	}
	c := grpchealth.NewClient(h2cClient(t), ts.URL, connect.WithGRPC())
	if _, err := c.Check(context.Background(), &grpchealth.CheckRequest{Service: "no.such.Service"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
	if code, body := getPage(t, ts.URL+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("GET /healthz: %d %q", code, body)
	}
	if code, body := getPage(t, ts.URL+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("GET /readyz: %d %q", code, body)
	}

	// A Watch started before the drain sees it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := c.Watch(ctx, &grpchealth.CheckRequest{})
	if ev := <-events; ev.Err != nil || ev.Response.Status != grpchealth.StatusServing {
		t.Fatalf("first watch event: %+v", ev)
	}
	ts.health.Drain()
	if ev := <-events; ev.Err != nil || ev.Response.Status != grpchealth.StatusNotServing {
		t.Fatalf("watch event after the drain: %+v", ev)
	}
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		if got := grpcStatus(t, ts.URL, service); got != grpchealth.StatusNotServing {
			t.Errorf("%q after Drain: %s", service, got)
		}
	}
	if code, body := getPage(t, ts.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("GET /readyz when draining: %d %q", code, body)
	}
	if code, _ := getPage(t, ts.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz when draining: %d, want 200 (liveness)", code)
	}
}

// With the default failure mode closed, an unreachable store makes the
// server NOT_SERVING until the breaker sees Redis answer again; failing
// open, it keeps serving.
func TestHealthFollowsTheStore(t *testing.T) {
	for _, mode := range []node.FailureMode{node.FailClosed, node.FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			r := redistest.Start(t)
			ts := startNodeServer(t, redisStoreOn(t, r), node.Config{
				DefaultFailureMode: mode,
				Breaker:            node.BreakerConfig{Failures: 1, ProbeEvery: 20 * time.Millisecond},
			}, Config{})
			p := node.Policy{Name: "p", Limit: fiveAMinute}
			r.Kill()
			if res, err := ts.node.Check(context.Background(), p, "k", 1); err != nil || res.Source == node.SourceStore {
				t.Fatalf("check with Redis down: %+v, %v", res, err)
			}
			want := grpchealth.StatusServing
			if mode == node.FailClosed {
				want = grpchealth.StatusNotServing
			}
			if got := grpcStatus(t, ts.URL, ""); got != want || ts.node.StoreAvailable() {
				t.Fatalf("store down, failing %s: %s (store available %t), want %s", mode, got, ts.node.StoreAvailable(), want)
			}
			code, body := getPage(t, ts.URL+"/readyz")
			if (code == http.StatusOK) != (want == grpchealth.StatusServing) {
				t.Errorf("GET /readyz with the store down: %d %q", code, body)
			}
			if mode == node.FailClosed && !strings.Contains(body, "store unavailable") {
				t.Errorf("GET /readyz does not say why: %q", body)
			}
			r.Restart()
			deadline := time.Now().Add(10 * time.Second)
			for grpcStatus(t, ts.URL, "") != grpchealth.StatusServing {
				if time.Now().After(deadline) {
					t.Fatal("still not serving 10s after Redis came back")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// Only GET (and HEAD) /healthz exist; other methods are refused.
func TestHealthzMethod(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
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
	ts := startServer(t, memory.New(nil, 0), Config{})
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
