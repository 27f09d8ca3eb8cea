package rpc

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Telemetry is where the wire sends traces and metrics, through the
// OpenTelemetry API (the SDK and exporters are the caller's). The zero value
// sends nothing and adds no interceptor.
//
// With a TracerProvider, every QuotaService and RateLimitService call is a
// server span named for its procedure (e.g. "quotad.v1.QuotaService/Check",
// as otelconnect names them), a child of the caller's span when the request
// carries trace context: quotad is an internal service and trusts it.
// CheckBatch adds a span "quotad.check_batch" whose children are its
// checks' spans. With a MeterProvider, calls are measured as the RPC
// semantic conventions say (rpc.server.call.duration). Both front ends,
// connect-go's and grpc-go's, are observed alike (call_telemetry.go).
type Telemetry struct {
	// TracerProvider makes the wire's tracer; nil means no spans.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the wire's meter; nil means no metrics.
	MeterProvider metric.MeterProvider
	// Propagator reads the caller's trace context from request headers (the
	// same for Connect, gRPC, gRPC-Web and JSON). nil means W3C Trace
	// Context and W3C Baggage.
	Propagator propagation.TextMapPropagator
}

const (
	batchSpanName = "quotad.check_batch"
	// attrBatchSize is how many checks a CheckBatch carries.
	attrBatchSize = attribute.Key("quotad.batch.size")
)

func (t Telemetry) propagator() propagation.TextMapPropagator {
	if t.Propagator != nil {
		return t.Propagator
	}
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// tracer is the tracer of the wire's own spans; a noop one when there is
// no provider.
func (t Telemetry) tracer() trace.Tracer {
	if t.TracerProvider == nil {
		return tracenoop.NewTracerProvider().Tracer("")
	}
	return t.TracerProvider.Tracer("github.com/quotad/quotad/rpc")
}
