package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// This file traces and measures the unary calls of the API (quotad's
// QuotaService and Envoy's RateLimitService), whichever front end they come
// by: a server span per call named for its procedure, and the RPC semantic
// conventions' rpc.server.call.duration, with the attributes otelconnect
// gives them. Every attribute set a call can record is built once, when the
// server starts, so recording a call is a clock read and one histogram
// update, with no attribute to sort, hash into a new set or allocate.

// rpcSystem is what rpc.system.name says carried a call: "connectrpc" for
// the Connect protocol (and HTTP/JSON), "grpc" for gRPC and gRPC-Web, as
// otelconnect names them.
type rpcSystem int

const (
	systemConnect rpcSystem = iota
	systemGRPC
	numSystems
)

var systemNames = [numSystems]string{"connectrpc", "grpc"}

// systemOf maps a connect-go protocol name to its rpcSystem.
func systemOf(protocol string) rpcSystem {
	if protocol == connect.ProtocolConnect {
		return systemConnect
	}
	return systemGRPC
}

// numCodes is one past the largest Connect code; index 0 stands for OK.
const numCodes = int(connect.CodeUnauthenticated) + 1

// statusName is rpc.response.status_code of a code (0: OK): gRPC's
// canonical names, as otelconnect writes them.
func statusName(c connect.Code) string {
	if c == 0 {
		return "OK"
	}
	return strings.ToUpper(c.String())
}

// procedureTelemetry is one procedure's precomputed attributes.
type procedureTelemetry struct {
	// name is the procedure without its leading slash,
	// "quotad.v1.QuotaService/Check": the span's name and rpc.method.
	name string
	// start are the span's attributes at its start, per system.
	start [numSystems][]attribute.KeyValue
	// status are the span's attributes at its end, per code.
	status [numCodes][]attribute.KeyValue
	// metric are the duration's options (its attributes), per system and
	// code: a slice each, so that recording does not allocate one.
	metric [numSystems][numCodes][]metric.RecordOption
}

// callTelemetry is the telemetry of the API's unary calls. A nil
// *callTelemetry records nothing. It is safe for concurrent use.
type callTelemetry struct {
	tracer     trace.Tracer // nil: no spans
	propagator propagation.TextMapPropagator
	duration   metric.Float64Histogram // nil: no metrics
	// procedures by full name, "/quotad.v1.QuotaService/Check".
	procedures map[string]*procedureTelemetry
}

// newCallTelemetry returns the telemetry of calls to procedures (full
// names, with their leading slash); nil when t asks for none.
func newCallTelemetry(t Telemetry, procedures []string) (*callTelemetry, error) {
	if t.TracerProvider == nil && t.MeterProvider == nil {
		return nil, nil
	}
	ct := &callTelemetry{propagator: t.propagator(), procedures: make(map[string]*procedureTelemetry, len(procedures))}
	if t.TracerProvider != nil {
		ct.tracer = t.TracerProvider.Tracer("github.com/quotad/quotad/rpc")
	}
	if t.MeterProvider != nil {
		d, err := t.MeterProvider.Meter("github.com/quotad/quotad/rpc").Float64Histogram("rpc.server.call.duration",
			metric.WithUnit("s"),
			metric.WithDescription("Measures the duration of inbound remote procedure calls."),
			// The semantic conventions' recommended buckets, as otelconnect
			// sets them.
			metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
		if err != nil {
			return nil, fmt.Errorf("telemetry: %w", err)
		}
		ct.duration = d
	}
	for _, full := range procedures {
		p := &procedureTelemetry{name: strings.TrimPrefix(full, "/")}
		for code := range numCodes {
			st := semconv.RPCResponseStatusCodeKey.String(statusName(connect.Code(code)))
			p.status[code] = []attribute.KeyValue{st}
			if code != 0 {
				p.status[code] = append(p.status[code], semconv.ErrorTypeKey.String(statusName(connect.Code(code))))
			}
		}
		for sys := range numSystems {
			p.start[sys] = []attribute.KeyValue{semconv.RPCSystemNameKey.String(systemNames[sys]), semconv.RPCMethodKey.String(p.name)}
			for code := range numCodes {
				set := attribute.NewSet(append(append([]attribute.KeyValue(nil), p.start[sys]...), p.status[code]...)...)
				p.metric[sys][code] = []metric.RecordOption{metric.WithAttributeSet(set)}
			}
		}
		ct.procedures[full] = p
	}
	return ct, nil
}

// procedure returns the telemetry of a procedure by its full name; nil
// when t is nil or the procedure is not measured.
func (t *callTelemetry) procedure(full string) *procedureTelemetry {
	if t == nil {
		return nil
	}
	return t.procedures[full]
}

// tracing reports whether calls are traced, so that a front end builds a
// carrier of the request's headers only then.
func (t *callTelemetry) tracing() bool { return t != nil && t.tracer != nil }

// call is one call being observed. Its zero value observes nothing.
type call struct {
	t     *callTelemetry
	p     *procedureTelemetry
	sys   rpcSystem
	begin time.Time
	span  trace.Span
}

// start observes a call of p over sys: it starts the server span, a child
// of the trace context in carrier (trusted, as quotad is an internal
// service; carrier may be nil when not tracing), and the clock. p nil
// observes nothing.
func (t *callTelemetry) start(ctx context.Context, p *procedureTelemetry, sys rpcSystem, carrier propagation.TextMapCarrier) (context.Context, call) {
	if p == nil {
		return ctx, call{}
	}
	c := call{t: t, p: p, sys: sys, begin: time.Now()}
	if t.tracer != nil {
		if carrier != nil && !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = t.propagator.Extract(ctx, carrier)
		}
		ctx, c.span = t.tracer.Start(ctx, p.name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(p.start[sys]...))
	}
	return ctx, c
}

// end records the call's outcome: ce nil for success, else the error the
// client gets.
func (c call) end(ctx context.Context, ce *connect.Error) {
	if c.p == nil {
		return
	}
	code := 0
	if ce != nil {
		code = int(ce.Code())
		if code <= 0 || code >= numCodes {
			code = int(connect.CodeUnknown)
		}
	}
	if c.span != nil {
		c.span.SetAttributes(c.p.status[code]...)
		if ce != nil && serverFault(ce.Code()) {
			c.span.SetStatus(codes.Error, ce.Message())
		}
		c.span.End()
	}
	if c.t.duration != nil {
		c.t.duration.Record(ctx, time.Since(c.begin).Seconds(), c.p.metric[c.sys][code]...)
	}
}

// serverFault reports whether a call ending with code is an error of the
// server, which marks its span as failed (the semantic conventions for
// server spans; otelconnect's choice): the client's mistakes are not.
func serverFault(c connect.Code) bool {
	switch c {
	case connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeUnimplemented,
		connect.CodeInternal, connect.CodeUnavailable, connect.CodeDataLoss:
		return true
	}
	return false
}

// connectInterceptor observes the Connect front end's calls. It goes
// before errorInterceptor, so that the error it sees is the client's.
func (t *callTelemetry) connectInterceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			p := t.procedure(req.Spec().Procedure)
			var carrier propagation.TextMapCarrier
			if t.tracing() {
				carrier = propagation.HeaderCarrier(req.Header())
			}
			ctx, c := t.start(ctx, p, systemOf(req.Peer().Protocol), carrier)
			res, err := next(ctx, req)
			var ce *connect.Error
			if err != nil && !errors.As(err, &ce) {
				ce = connect.NewError(connect.CodeUnknown, err)
			}
			c.end(ctx, ce)
			return res, err
		}
	})
}
