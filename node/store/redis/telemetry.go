package redis

// This file is the Redis store's telemetry: a client span "EVALSHA" for
// each script call a check or a lease release makes ("SET" for a check a
// fresh write decided; a child of the check's span), and the db.client.operation.duration and
// quotad.store.errors metrics, under the node's instrumentation scope
// (docs/observability.md).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// dbAttributes describes the store in OpenTelemetry's database terms, for
// the spans of its calls: db.system.name, and for a single server its
// address, port and database index (db.namespace).
func (s *Store) dbAttributes() []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.DBSystemNameRedis}
	c, ok := s.client.(*goredis.Client)
	if !ok {
		return attrs
	}
	opts := c.Options()
	attrs = append(attrs, semconv.DBNamespace(strconv.Itoa(opts.DB)))
	if host, port, err := net.SplitHostPort(opts.Addr); err == nil {
		attrs = append(attrs, semconv.ServerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.ServerPort(p))
		}
	}
	return attrs
}

// Names of the attributes a call's span carries beyond OpenTelemetry's
// database ones: units asked for and taken beyond the check's own cost,
// and units a release gives back.
const (
	attrLeaseWant     = attribute.Key("quotad.lease.want")
	attrLeaseGranted  = attribute.Key("quotad.lease.granted")
	attrLeaseReleased = attribute.Key("quotad.lease.released")
)

// durationBuckets are the boundaries of db.client.operation.duration, in
// seconds: a call takes about a millisecond on a LAN.
var durationBuckets = []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

var _ node.InstrumentedStore = (*Store)(nil)

// Instrument implements node.InstrumentedStore: from then on the store's
// Acquire and Release calls are traced and measured with t; with neither a
// tracer nor a meter in t, they are not. It must be called before the
// store's first call.
func (s *Store) Instrument(t node.Telemetry) error {
	tracer, meter := t.Tracer(), t.Meter()
	if tracer == nil && meter == nil {
		return nil
	}
	db, err := newDBTelemetry(tracer, meter, s.dbAttributes())
	if err != nil {
		return err
	}
	s.db = db
	return nil
}

// Acquire implements node.Store: acquire, inside a span and measured when
// the store is instrumented.
func (s *Store) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	if s.db == nil {
		return s.acquire(ctx, r, nil)
	}
	var span trace.Span
	if r.Want > r.Cost {
		ctx, span = s.db.start(ctx, r.Limit.Algorithm.String(), attrLeaseWant.Int64(r.Want-r.Cost))
	} else {
		ctx, span = s.db.start(ctx, r.Limit.Algorithm.String())
	}
	start := time.Now()
	d, g, err := s.acquire(ctx, r, span)
	var granted []attribute.KeyValue
	if span != nil && r.Want > r.Cost {
		granted = []attribute.KeyValue{attrLeaseGranted.Int64(max(0, g.Units-r.Cost))}
	}
	s.db.end(ctx, span, start, err, granted...)
	return d, g, err
}

// Release implements node.Store: giveBack, inside a span and measured when
// the store is instrumented.
func (s *Store) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	if s.db == nil {
		return s.giveBack(ctx, base, l, units, g)
	}
	ctx, span := s.db.start(ctx, "release_"+l.Algorithm.String(), attrLeaseReleased.Int64(units))
	start := time.Now()
	returned, err := s.giveBack(ctx, base, l, units, g)
	s.db.end(ctx, span, start, err)
	return returned, err
}

// redisOperation is the command every store call is: a Lua script by SHA
// (a NOSCRIPT retry as EVAL is part of the same call), but for a check
// that a fresh write decided (freshOperation).
const redisOperation = "EVALSHA"

// freshOperation is the command of a check decided by a fresh write
// (algorithms.Fresh): a plain SET ... NX.
const freshOperation = "SET"

// markFreshWrite renames a store call's span, if it has one, for a check
// a fresh write decided: it made no script call. The metrics keep one
// operation name for every call.
func markFreshWrite(span trace.Span) { markPlain(span, freshOperation) }

// windowOperation is the command of a window algorithm's check made with
// plain commands (windows.go); one of cost 0 is a GET.
const windowOperation = "INCRBY"

// markPlain renames a store call's span, if it has one, for a check that
// plain commands decided, op the first of them.
func markPlain(span trace.Span, op string) {
	if span != nil {
		span.SetName(op)
		span.SetAttributes(semconv.DBOperationName(op))
	}
}

// dbTelemetry instruments the calls to a Redis store.
type dbTelemetry struct {
	tracer    trace.Tracer // nil: no spans
	spanAttrs []attribute.KeyValue

	duration metric.Float64Histogram // nil: no metrics
	errors   metric.Int64Counter
	okOpts   []metric.RecordOption
}

func newDBTelemetry(tracer trace.Tracer, meter metric.Meter, attrs []attribute.KeyValue) (*dbTelemetry, error) {
	d := &dbTelemetry{tracer: tracer, spanAttrs: append(attrs[:len(attrs):len(attrs)], semconv.DBOperationName(redisOperation))}
	if meter == nil {
		return d, nil
	}
	var err error
	// db.client.operation.duration is the semantic conventions' instrument;
	// its recommended attributes are the low-cardinality ones.
	if d.duration, err = meter.Float64Histogram("db.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of database client operations."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, fmt.Errorf("db.client.operation.duration: %w", err)
	}
	if d.errors, err = meter.Int64Counter("quotad.store.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed Redis calls, by error.type.")); err != nil {
		return nil, fmt.Errorf("quotad.store.errors: %w", err)
	}
	d.okOpts = []metric.RecordOption{metric.WithAttributeSet(d.metricAttributes(""))}
	return d, nil
}

func (d *dbTelemetry) metricAttributes(errorType string) attribute.Set {
	kv := []attribute.KeyValue{semconv.DBSystemNameRedis, semconv.DBOperationName(redisOperation)}
	if errorType != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(errorType))
	}
	return attribute.NewSet(kv...)
}

// start begins the span of one store call, if ctx is part of a trace: a
// call no check waits for (the janitor returning expired leases) would
// otherwise be a trace of its own every few hundred milliseconds.
func (d *dbTelemetry) start(ctx context.Context, script string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if d.tracer == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	all := make([]attribute.KeyValue, 0, len(d.spanAttrs)+1+len(attrs))
	all = append(append(append(all, d.spanAttrs...), semconv.DBStoredProcedureName(script)), attrs...)
	return d.tracer.Start(ctx, redisOperation, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(all...))
}

// end finishes a store call begun at start: its span, if any, and its
// metrics.
func (d *dbTelemetry) end(ctx context.Context, span trace.Span, start time.Time, err error, attrs ...attribute.KeyValue) {
	errorType := ""
	if err != nil {
		errorType = redisErrorType(err)
	}
	if d.duration != nil {
		opts := d.okOpts
		if err != nil {
			set := d.metricAttributes(errorType)
			opts = []metric.RecordOption{metric.WithAttributeSet(set)}
			d.errors.Add(ctx, 1, metric.WithAttributeSet(set))
		}
		d.duration.Record(ctx, time.Since(start).Seconds(), opts...)
	}
	if span == nil {
		return
	}
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType))
		span.SetStatus(codes.Error, err.Error())
	} else if len(attrs) > 0 {
		span.SetAttributes(attrs...)
	}
	span.End()
}

// redisErrorType names a failed call's error for error.type, from a small
// set: overloaded (the node did not get to the call in time, while Redis
// answered), timeout, canceled, closed, network, the Redis error code (the
// first word of a Redis error reply, e.g. NOSCRIPT, BUSY, READONLY), or
// _OTHER.
func redisErrorType(err error) string {
	var rerr goredis.Error
	var nerr net.Error
	switch {
	case errors.Is(err, node.ErrOverloaded):
		return "overloaded"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, goredis.ErrClosed):
		return "closed"
	case errors.As(err, &rerr):
		if code := redisErrorCode(rerr.Error()); code != "" {
			return code
		}
	case errors.As(err, &nerr):
		if nerr.Timeout() {
			return "timeout"
		}
		return "network"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// redisErrorCode returns the leading upper-case word of a Redis error
// reply, or "" if it has none; longer words are not codes (and would make
// error.type unbounded).
func redisErrorCode(msg string) string {
	for i := 0; i < len(msg) && i <= 16; i++ {
		c := msg[i]
		if c == ' ' && i > 0 {
			return msg[:i]
		}
		if c < 'A' || c > 'Z' {
			return ""
		}
	}
	if len(msg) > 0 && len(msg) <= 16 {
		return msg
	}
	return ""
}
