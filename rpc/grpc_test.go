package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/envoy"
)

// Tests of the gRPC front end with grpc-go's own client, as most gRPC
// clients are (the rest of the package's gRPC tests use connect-go's).

// grpcConn is a grpc-go client connection to ts.
func grpcConn(t *testing.T, ts *testServer) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(ts.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The hand-written service descriptions are the proto files' services:
// every method, unary, with the proto's request type.
func TestGRPCMethodsMatchProto(t *testing.T) {
	h := &Handler{svc: &service{}, rls: &envoy.Service{}}
	f := grpcFront{log: nil}
	for _, sd := range []*grpc.ServiceDesc{f.quotaService(h.svc), f.rateLimitService(h.rls)} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(sd.ServiceName))
		if err != nil {
			t.Fatalf("%s: %v", sd.ServiceName, err)
		}
		svc := d.(protoreflect.ServiceDescriptor)
		if svc.ParentFile().Path() != sd.Metadata {
			t.Errorf("%s: metadata %v, want %s", sd.ServiceName, sd.Metadata, svc.ParentFile().Path())
		}
		var want, got []string
		for i := range svc.Methods().Len() {
			m := svc.Methods().Get(i)
			if m.IsStreamingClient() || m.IsStreamingServer() {
				t.Errorf("%s: streaming, but registered as unary", m.FullName())
			}
			want = append(want, string(m.Name()))
		}
		for _, m := range sd.Methods {
			got = append(got, m.MethodName)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) || len(sd.Streams) != 0 {
			t.Errorf("%s: methods %v and %d streams, want %v", sd.ServiceName, got, len(sd.Streams), want)
		}
	}
}

// Every service of the API answers a stock grpc-go client, on grpc-go's
// transport: the HTTP front end sees none of it.
func TestGRPCFrontEnd(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, rlsServerConfig(), rlsServerPolicies()...)}, rlsServerPolicies()...)
	conn := grpcConn(t, ts)
	ctx := context.Background()
	before := ts.httpRequests.Load()

	check := &quotadv1.CheckResponse{}
	if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, &quotadv1.CheckRequest{Policy: "per-ip", Key: "a"}, check); err != nil || !check.GetAllowed() || check.GetRemaining() != 4 {
		t.Fatalf("Check: %v, %v", check, err)
	}
	batch := &quotadv1.CheckBatchResponse{}
	err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckBatchProcedure, &quotadv1.CheckBatchRequest{Requests: []*quotadv1.CheckRequest{
		{Policy: "per-ip", Key: "a"}, {Policy: "nope", Key: "a"},
	}}, batch)
	if rs := batch.GetResults(); err != nil || len(rs) != 2 || rs[0].GetResponse().GetRemaining() != 3 || rs[1].GetError().GetCode() != "not_found" {
		t.Fatalf("CheckBatch: %v, %v", batch, err)
	}
	policies := &quotadv1.ListPoliciesResponse{}
	if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceListPoliciesProcedure, &quotadv1.ListPoliciesRequest{}, policies); err != nil || len(policies.GetPolicies()) != 3 {
		t.Fatalf("ListPolicies: %v, %v", policies, err)
	}
	if err := conn.Invoke(ctx, quotadv1connect.QuotaServiceResetProcedure, &quotadv1.ResetRequest{Policy: "per-ip", Key: "a"}, &quotadv1.ResetResponse{}); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	rls := &rlsv3.RateLimitResponse{}
	if err := conn.Invoke(ctx, ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure,
		&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}}, rls); err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if rls.GetOverallCode() != rlsOK || rls.GetStatuses()[0].GetLimitRemaining() != 4 {
		t.Fatalf("ShouldRateLimit: %v", rls)
	}
	// An error has the code and message the Connect front end gives.
	err = conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, &quotadv1.CheckRequest{Policy: "nope", Key: "a"}, check)
	if s := grpcstatus.Convert(err); s.Code() != codes.NotFound || !strings.HasPrefix(s.Message(), `policy: unknown policy "nope"`) {
		t.Fatalf("unknown policy: %v", err)
	}
	if n := ts.httpRequests.Load() - before; n != 0 {
		t.Fatalf("the HTTP front end served %d of the gRPC calls", n)
	}
}

// gRPC health on grpc-go answers from the same readiness as the HTTP
// front end: SERVING, NotFound for an unknown service, and a Watch that
// sees a drain.
func TestGRPCHealth(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := healthv1.NewHealthClient(grpcConn(t, ts))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		res, err := c.Check(ctx, &healthv1.HealthCheckRequest{Service: service})
		if err != nil || res.GetStatus() != healthv1.HealthCheckResponse_SERVING {
			t.Fatalf("Check %q: %v, %v", service, res, err)
		}
	}
	if _, err := c.Check(ctx, &healthv1.HealthCheckRequest{Service: "no.such.Service"}); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("unknown service: %v, want NotFound", err)
	}
	w, err := c.Watch(ctx, &healthv1.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := w.Recv(); err != nil || res.GetStatus() != healthv1.HealthCheckResponse_SERVING {
		t.Fatalf("first Watch answer: %v, %v", res, err)
	}
	ts.health.Drain()
	if res, err := w.Recv(); err != nil || res.GetStatus() != healthv1.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch answer after the drain: %v, %v", res, err)
	}
	if got := grpcStatus(t, ts.URL, ""); got != grpchealth.StatusNotServing {
		t.Fatalf("Check after the drain: %s", got)
	}
}

// Reflection on grpc-go, v1 and v1alpha, lists the services the HTTP front
// end's reflection lists, and describes them.
func TestGRPCReflection(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, rlsServerConfig(), rlsServerPolicies()...)}, rlsServerPolicies()...)
	want := slices.Sorted(slices.Values(ts.handler.reflected))
	if got := quotadtest.ReflectedServices(t, grpcConn(t, ts), ratelimitv3connect.RateLimitServiceName); !slices.Equal(got, want) {
		t.Errorf("ListServices %v, want %v", got, want)
	}
}

// rawCodec sends bytes as they are, to hand the server a malformed
// message.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

var _ encoding.CodecV2 = rawCodec{}

// A request that does not decode is InvalidArgument with the same message
// on both front ends (grpc-go alone would answer Internal).
func TestGRPCMalformedRequest(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	// policy "demo", key of two bytes that are not UTF-8.
	bad := []byte{0x0a, 4, 'd', 'e', 'm', 'o', 0x12, 2, 0xff, 0xfe}
	var out []byte
	err := grpcConn(t, ts).Invoke(context.Background(), quotadv1connect.QuotaServiceCheckProcedure, &bad, &out, grpc.ForceCodecV2(rawCodec{}))
	s := grpcstatus.Convert(err)
	const want = "unmarshal message: unmarshal into *quotadv1.CheckRequest: "
	if s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), want) {
		t.Fatalf("gRPC: %v, want InvalidArgument %q...", err, want)
	}
	// The same bytes through Connect.
	res, err := http1Client(t).Post(ts.URL+quotadv1connect.QuotaServiceCheckProcedure, "application/proto", bytes.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var e struct{ Code, Message string }
	if err := json.Unmarshal(body, &e); err != nil || e.Code != "invalid_argument" || e.Message != s.Message() {
		t.Fatalf("Connect answered %d %s; gRPC %q", res.StatusCode, body, s.Message())
	}
}

// A panic in the core is Internal with the generic message, and logged
// with its stack, as on the Connect front end.
func TestGRPCPanicIsInternal(t *testing.T) {
	log := &syncBuffer{}
	m := grpcUnary(grpcFront{log: slogTo(log)}, "/test.v1.Panic/Do", func(context.Context, *quotadv1.ResetRequest) (*quotadv1.ResetResponse, error) {
		panic("boom")
	})
	dec := func(v any) error {
		r := v.(*grpcRequest)
		return proto.Unmarshal(nil, r.msg)
	}
	_, err := m.Handler(nil, context.Background(), dec, nil)
	if s := grpcstatus.Convert(err); s.Code() != codes.Internal || !strings.Contains(s.Message(), "internal error") {
		t.Fatalf("got %v, want Internal", err)
	}
	if !strings.Contains(log.String(), "boom") || !strings.Contains(log.String(), "Panic/Do") {
		t.Fatalf("the panic was not logged: %s", log)
	}
}

// Calls on grpc-go are measured like those on connect-go, with
// rpc.system.name grpc.
func TestGRPCCallsAreMeasured(t *testing.T) {
	mp, reader := manualMeter(t)
	n, err := node.New(node.Config{}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := NewHandler(n, Config{Telemetry: Telemetry{MeterProvider: mp}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{URL: serveAPI(t, h, h)}
	conn := grpcConn(t, ts)
	err = conn.Invoke(context.Background(), quotadv1connect.QuotaServiceCheckProcedure, &quotadv1.CheckRequest{Policy: "nope", Key: "k"}, &quotadv1.CheckResponse{})
	if grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("got %v, want NotFound", err)
	}
	c := quotadv1connect.NewQuotaServiceClient(http1Client(t), ts.URL)
	if _, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: fw5()})); err != nil {
		t.Fatal(err)
	}
	got := callDurations(t, reader)
	for _, k := range []string{
		"error.type=NOT_FOUND,rpc.method=quotad.v1.QuotaService/Check,rpc.response.status_code=NOT_FOUND,rpc.system.name=grpc",
		"rpc.method=quotad.v1.QuotaService/Check,rpc.response.status_code=OK,rpc.system.name=connectrpc",
	} {
		if got[k] != 1 {
			t.Errorf("%s: %d, want 1 (all: %v)", k, got[k], got)
		}
	}
}

// One HTTP/2 connection carrying gRPC first and Connect next (as a proxy
// multiplexing clients may send): grpc-go refuses the Connect request, so
// the connection needs ConnectOnly, with which both are served.
func TestMixedConnection(t *testing.T) {
	h := memoryHandler(t)
	req := &quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: fw5()}
	for _, connectOnly := range []bool{false, true} {
		url := serveAPIWith(t, h, h, ServerConfig{ConnectOnly: connectOnly})
		// One h2c transport: both clients share its one connection.
		hc := h2cClient(t)
		ctx := context.Background()
		if _, err := quotadv1connect.NewQuotaServiceClient(hc, url, connect.WithGRPC()).Check(ctx, connect.NewRequest(req)); err != nil {
			t.Fatalf("connect only %t: gRPC: %v", connectOnly, err)
		}
		_, err := quotadv1connect.NewQuotaServiceClient(hc, url).Check(ctx, connect.NewRequest(req))
		if connectOnly && err != nil {
			t.Fatalf("connect only: Connect after gRPC on one connection: %v", err)
		}
		if !connectOnly && err == nil {
			t.Fatal("Connect after gRPC on one connection was served by grpc-go; the limitation is gone, update the docs")
		}
	}
}
