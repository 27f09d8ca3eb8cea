package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// tracedServer is a node on the memory store behind the handler, both
// tracing into one in-memory recorder, served like cmd/quotad serves.
func tracedServer(t *testing.T) (string, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	n, err := node.New(node.Config{Telemetry: node.Telemetry{TracerProvider: tp}}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := NewHandler(n, Config{Telemetry: Telemetry{TracerProvider: tp}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveAPI(t, h, h), sr
}

// spanNamed returns the one ended span called name, failing otherwise.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1", len(found), name)
	}
	return found[0]
}

// childOf fails the test unless child's parent is parent, in the same trace.
func childOf(t *testing.T, child sdktrace.ReadOnlySpan, parent trace.SpanContext) {
	t.Helper()
	if child.SpanContext().TraceID() != parent.TraceID() || child.Parent().SpanID() != parent.SpanID() {
		t.Fatalf("span %q: trace %s parent %s, want trace %s parent %s", child.Name(),
			child.SpanContext().TraceID(), child.Parent().SpanID(), parent.TraceID(), parent.SpanID())
	}
}

var demoLimit = &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 5, Period: durationpb.New(time.Minute)}

// A Connect or gRPC client's trace continues in quotad: the client's span
// is the parent of quotad's server span, whose child is the check's span.
func TestClientTraceIsTheParent(t *testing.T) {
	for _, protocol := range []string{"connect", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			url, sr := tracedServer(t)
			// The client traces with its own provider and sends W3C trace
			// context, as any OpenTelemetry-instrumented client does.
			clientSpans := tracetest.NewSpanRecorder()
			clientTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(clientSpans))
			defer func() { _ = clientTP.Shutdown(context.Background()) }()
			ci, err := otelconnect.NewInterceptor(otelconnect.WithTracerProvider(clientTP), otelconnect.WithoutMetrics(),
				otelconnect.WithPropagator(propagation.TraceContext{}))
			if err != nil {
				t.Fatal(err)
			}
			opts := []connect.ClientOption{connect.WithInterceptors(ci)}
			hc := http1Client(t)
			if protocol == "grpc" {
				opts, hc = append(opts, connect.WithGRPC()), h2cClient(t)
			}
			c := quotadv1connect.NewQuotaServiceClient(hc, url, opts...)
			if _, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: demoLimit})); err != nil {
				t.Fatal(err)
			}
			client := spanNamed(t, clientSpans.Ended(), "quotad.v1.QuotaService/Check")
			server := spanNamed(t, sr.Ended(), "quotad.v1.QuotaService/Check")
			childOf(t, server, client.SpanContext())
			if !server.Parent().IsRemote() || server.SpanKind() != trace.SpanKindServer {
				t.Errorf("server span: parent remote %t, kind %s; want a remote parent and kind server", server.Parent().IsRemote(), server.SpanKind())
			}
			check := spanNamed(t, sr.Ended(), "quotad.check")
			childOf(t, check, server.SpanContext())
		})
	}
}

// A plain HTTP/JSON request with a traceparent header joins that trace.
func TestJSONTraceparent(t *testing.T) {
	url, sr := tracedServer(t)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, url+"/quotad.v1.QuotaService/Check",
		strings.NewReader(`{"policy":"demo","key":"k","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http1Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	server := spanNamed(t, sr.Ended(), "quotad.v1.QuotaService/Check")
	if got := server.SpanContext().TraceID().String(); got != traceID || server.Parent().SpanID().String() != parentID {
		t.Fatalf("server span in trace %s under %s, want trace %s under %s", got, server.Parent().SpanID(), traceID, parentID)
	}
	childOf(t, spanNamed(t, sr.Ended(), "quotad.check"), server.SpanContext())
}

// CheckBatch is a span whose children are its checks' spans.
func TestCheckBatchSpan(t *testing.T) {
	url, sr := tracedServer(t)
	c := quotadv1connect.NewQuotaServiceClient(http1Client(t), url)
	req := &quotadv1.CheckBatchRequest{Requests: []*quotadv1.CheckRequest{
		{Policy: "demo", Key: "a", Limit: demoLimit},
		{Policy: "demo", Key: "b", Limit: demoLimit},
		{Policy: "demo", Key: "", Limit: demoLimit}, // invalid
	}}
	if _, err := c.CheckBatch(context.Background(), connect.NewRequest(req)); err != nil {
		t.Fatal(err)
	}
	ended := sr.Ended()
	server := spanNamed(t, ended, "quotad.v1.QuotaService/CheckBatch")
	batch := spanNamed(t, ended, "quotad.check_batch")
	childOf(t, batch, server.SpanContext())
	var size int64
	for _, kv := range batch.Attributes() {
		if kv.Key == attrBatchSize {
			size = kv.Value.AsInt64()
		}
	}
	if size != 3 {
		t.Errorf("quotad.batch.size = %d, want 3", size)
	}
	var checks int
	for _, s := range ended {
		if s.Name() == "quotad.check" {
			childOf(t, s, batch.SpanContext())
			checks++
		}
	}
	// The key is validated before the node is asked, so the invalid item
	// has no check span.
	if checks != 2 {
		t.Fatalf("%d quotad.check spans, want 2", checks)
	}
}
