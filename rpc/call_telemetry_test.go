package rpc

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// meteredCalls is call telemetry with metrics only, read by a manual
// reader.
func meteredCalls(t testing.TB) (*callTelemetry, *sdkmetric.ManualReader) {
	t.Helper()
	mp, reader := manualMeter(t)
	tel, err := newCallTelemetry(Telemetry{MeterProvider: mp}, apiProcedures)
	if err != nil {
		t.Fatal(err)
	}
	return tel, reader
}

// manualMeter is a meter provider read by hand.
func manualMeter(t testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, reader
}

// callDurations returns the recorded rpc.server.call.duration points by
// their attributes, written k=v,k=v in sorted key order.
func callDurations(t *testing.T, reader *sdkmetric.ManualReader) map[string]uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "rpc.server.call.duration" {
				continue
			}
			for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				key := ""
				for i, kv := range p.Attributes.ToSlice() {
					if i > 0 {
						key += ","
					}
					key += string(kv.Key) + "=" + kv.Value.String()
				}
				out[key] += p.Count
			}
		}
	}
	return out
}

// A call records one duration with otelconnect's attributes: the method,
// the system, the status code, and on errors error.type.
func TestCallTelemetryAttributes(t *testing.T) {
	tel, reader := meteredCalls(t)
	p := tel.procedure(quotadv1connect.QuotaServiceCheckProcedure)
	ctx, c := tel.start(context.Background(), p, systemGRPC, nil)
	c.end(ctx, nil)
	ctx, c = tel.start(context.Background(), p, systemConnect, nil)
	c.end(ctx, connect.NewError(connect.CodeNotFound, nil))
	got := callDurations(t, reader)
	want := map[string]uint64{
		"rpc.method=quotad.v1.QuotaService/Check,rpc.response.status_code=OK,rpc.system.name=grpc":                                   1,
		"error.type=NOT_FOUND,rpc.method=quotad.v1.QuotaService/Check,rpc.response.status_code=NOT_FOUND,rpc.system.name=connectrpc": 1,
	}
	if len(got) != len(want) {
		t.Fatalf("points %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
	if tel.procedure("/no.such.Service/Call") != nil {
		t.Error("an unknown procedure has telemetry")
	}
	var none *callTelemetry
	ctx, c = none.start(context.Background(), none.procedure(quotadv1connect.QuotaServiceCheckProcedure), systemGRPC, nil)
	c.end(ctx, nil) // no telemetry: nothing to do, no panic
}

// Recording a call's duration builds no attribute set: the sets were
// built when the server started.
func TestCallTelemetryDoesNotAllocate(t *testing.T) {
	tel, _ := meteredCalls(t)
	p := tel.procedure(quotadv1connect.QuotaServiceCheckProcedure)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		_, c := tel.start(ctx, p, systemGRPC, nil)
		c.end(ctx, nil)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per call, want 0", allocs)
	}
}

func BenchmarkCallTelemetry(b *testing.B) {
	tel, _ := meteredCalls(b)
	p := tel.procedure(quotadv1connect.QuotaServiceCheckProcedure)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, c := tel.start(ctx, p, systemGRPC, nil)
			c.end(ctx, nil)
		}
	})
}
