package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc"
)

// Trace exporters quotad can use (--trace-exporter).
const (
	exporterNone     = "none"
	exporterOTLPGRPC = "otlp-grpc"
	exporterOTLPHTTP = "otlp-http"
	exporterStdout   = "stdout"
)

// telemetryConfig says where quotad sends traces and whether it serves
// metrics. The OTLP exporters also read the standard OTEL_EXPORTER_OTLP_*
// variables (headers, TLS, compression, timeout) from the environment
// themselves, and the SDK reads OTEL_BSP_*, OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES.
type telemetryConfig struct {
	// TraceExporter is none, otlp-grpc, otlp-http or stdout. Empty means
	// OTEL_TRACES_EXPORTER (otlp, console or none), and none without it.
	TraceExporter string
	// TraceEndpoint is where an OTLP exporter sends spans: a URL
	// (http://collector:4317; an http URL means no TLS, and otlp-http
	// appends /v1/traces to a URL without a path) or host:port. Empty
	// leaves it to OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, then the exporter's
	// default (localhost:4317 for gRPC, localhost:4318 for HTTP).
	TraceEndpoint string
	// TraceSampleRatio is the share of new traces recorded, in [0, 1];
	// a request that arrives with trace context follows its caller's
	// decision. nil leaves it to OTEL_TRACES_SAMPLER, and records every
	// trace without it.
	TraceSampleRatio *float64
	// Metrics serves Prometheus metrics at GET /metrics on the API's port.
	// Default true.
	Metrics bool
	// Statsd sends envoyproxy/ratelimit's statistics to statsd (statsd.go);
	// the zero value sends none.
	Statsd statsdConfig
}

func (t telemetryConfig) validate() error {
	switch t.TraceExporter {
	case "", exporterNone, exporterOTLPGRPC, exporterOTLPHTTP, exporterStdout:
	default:
		return fmt.Errorf("trace exporter: %q is not none, otlp-grpc, otlp-http or stdout", t.TraceExporter)
	}
	if t.TraceEndpoint != "" {
		if err := validateEndpoint(t.TraceEndpoint); err != nil {
			return fmt.Errorf("trace endpoint: %w", err)
		}
	}
	if r := t.TraceSampleRatio; r != nil && !(*r >= 0 && *r <= 1) {
		return fmt.Errorf("trace sample ratio: %g is not in [0, 1]", *r)
	}
	return t.Statsd.validate()
}

// validateEndpoint accepts an http(s) URL with a host, or host:port. The
// exporters would silently keep their default on a bad URL.
func validateEndpoint(ep string) error {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return fmt.Errorf("%q: %w", ep, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%q: want http://host:port or https://host:port", ep)
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return fmt.Errorf("%q: want a URL or host:port: %w", ep, err)
	}
	return nil
}

// traceExporter resolves the exporter to use: the setting, else
// OTEL_TRACES_EXPORTER with the OTLP protocol from
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (the specification's default is
// http/protobuf), else none.
func (t telemetryConfig) traceExporter(getenv func(string) string) (string, error) {
	if t.TraceExporter != "" {
		return t.TraceExporter, nil
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", "none":
		return exporterNone, nil
	case "console":
		return exporterStdout, nil
	case "otlp":
		protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch protocol {
		case "grpc":
			return exporterOTLPGRPC, nil
		case "", "http/protobuf":
			return exporterOTLPHTTP, nil
		}
		return "", fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is not supported (want grpc or http/protobuf)", protocol)
	default:
		return "", fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (want otlp, console or none; one exporter)", v)
	}
}

// telemetry is quotad's OpenTelemetry SDK: the providers the node and the
// wire are given, the /metrics handler, and what flushes them on shutdown.
type telemetry struct {
	// exporter is the trace exporter in use, for the startup banner.
	exporter string
	tracer   trace.TracerProvider // nil: no tracing
	meter    metric.MeterProvider // nil: no metrics
	metrics  http.Handler         // nil: no /metrics
	statsd   statsdConfig         // where statistics are sent, for the banner
	// shutdowns flush and stop the providers, tracer first.
	shutdowns []func(context.Context) error
}

// startTelemetry sets up tracing and metrics as cfg and the OTEL_*
// environment say. Nothing it starts blocks a check: spans go through a
// batching processor that drops spans when its queue is full rather than
// wait, metrics are read only when /metrics is scraped, and statsd is sent
// from a goroutine of its own every flush interval. OTEL_SDK_DISABLED=true
// turns traces and metrics off, and is refused with statsd, which would
// send nothing.
func startTelemetry(ctx context.Context, cfg telemetryConfig, getenv func(string) string, stdout io.Writer, log *slog.Logger) (*telemetry, error) {
	t := &telemetry{exporter: exporterNone}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		if cfg.Statsd.Addr != "" {
			return nil, errors.New("OTEL_SDK_DISABLED=true turns off the metrics --statsd-addr sends: unset one of them")
		}
		return t, nil
	}
	t.statsd = cfg.Statsd
	kind, err := cfg.traceExporter(getenv)
	if err != nil {
		return nil, err
	}
	if kind == exporterNone && !cfg.Metrics && cfg.Statsd.Addr == "" {
		return t, nil
	}
	// service.name defaults to quotad; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, read later, override it.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("quotad")), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	if kind != exporterNone {
		exp, err := spanExporter(ctx, kind, cfg.TraceEndpoint, stdout)
		if err != nil {
			return nil, fmt.Errorf("trace exporter %s: %w", kind, err)
		}
		opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
		if r := cfg.TraceSampleRatio; r != nil {
			opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*r))))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		t.exporter, t.tracer = kind, tp
		t.shutdowns = append(t.shutdowns, tp.Shutdown)
	}
	var readers []sdkmetric.Option
	if cfg.Statsd.Addr != "" {
		readers = append(readers, sdkmetric.WithReader(statsdReader(newStatsdExporter(cfg.Statsd, log), cfg.Statsd.FlushInterval)))
	}
	if cfg.Metrics {
		// A registry of our own, not Prometheus's global one: two quotads
		// in one process (tests) must not share metrics.
		reg := prometheus.NewRegistry()
		if err := reg.Register(collectors.NewGoCollector()); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(),
			// Prometheus names (quotad_decisions_total), whatever the
			// process-wide validation scheme of prometheus/common says.
			otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	if len(readers) > 0 {
		mp := sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		t.meter = mp
		t.shutdowns = append(t.shutdowns, mp.Shutdown)
	}
	return t, nil
}

// spanExporter makes the exporter of kind. OTLP exporters connect lazily:
// a collector that is down costs dropped spans, never a failed start.
func spanExporter(ctx context.Context, kind, endpoint string, stdout io.Writer) (sdktrace.SpanExporter, error) {
	isURL := strings.Contains(endpoint, "://")
	switch kind {
	case exporterOTLPGRPC:
		var opts []otlptracegrpc.Option
		if isURL {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		} else if endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(endpoint))
		}
		return otlptracegrpc.New(ctx, opts...)
	case exporterOTLPHTTP:
		var opts []otlptracehttp.Option
		if isURL {
			// As OTEL_EXPORTER_OTLP_ENDPOINT does, a base URL gets the
			// signal's path.
			if u, _ := url.Parse(endpoint); u.Path == "" || u.Path == "/" {
				endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
		} else if endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpoint(endpoint))
		}
		return otlptracehttp.New(ctx, opts...)
	case exporterStdout:
		return stdouttrace.New(stdouttrace.WithWriter(stdout))
	}
	return nil, fmt.Errorf("unknown exporter %q", kind)
}

// node is the node's share of the telemetry.
func (t *telemetry) node() node.Telemetry {
	return node.Telemetry{TracerProvider: t.tracer, MeterProvider: t.meter}
}

// rpc is the wire's share of the telemetry.
func (t *telemetry) rpc() rpc.Telemetry {
	// The default propagator, W3C Trace Context and Baggage, is what
	// OpenTelemetry clients send.
	return rpc.Telemetry{TracerProvider: t.tracer, MeterProvider: t.meter}
}

// handler serves GET /metrics beside api when metrics are on.
func (t *telemetry) handler(api http.Handler) http.Handler {
	if t.metrics == nil {
		return api
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", t.metrics)
	mux.Handle("/", api)
	return mux
}

// describe says where telemetry goes, for the startup banner.
func (t *telemetry) describe() string {
	metrics := "off"
	if t.metrics != nil {
		metrics = "GET /metrics"
	}
	return fmt.Sprintf("traces: %s, metrics: %s%s", t.exporter, metrics, t.statsd.describe())
}

// Shutdown exports the spans still queued and stops the providers. Call it
// last, after the server has drained and the node has closed, so that the
// spans and metrics of shutdown itself are kept.
func (t *telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, shutdown := range t.shutdowns {
		errs = append(errs, shutdown(ctx))
	}
	return errors.Join(errs...)
}

// telemetryFlushTimeout bounds the last export on shutdown. The OTLP
// exporters retry an unreachable collector for up to their own timeout
// (10s by default): quotad has shut down by then, and the spans of a
// collector that is down are lost either way.
const telemetryFlushTimeout = 2 * time.Second

// shutdownLogged is Shutdown within timeout, and at most
// telemetryFlushTimeout, logging rather than returning a failure: a
// collector that cannot be reached must not make quotad exit with an
// error, nor keep it from exiting.
func (t *telemetry) shutdownLogged(log *slog.Logger, timeout time.Duration) {
	if len(t.shutdowns) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(timeout, telemetryFlushTimeout))
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("telemetry shutdown: spans may be lost", "err", err)
	}
}

// logOtelTo sends OpenTelemetry's own errors and log lines (an exporter
// that cannot reach its collector, a dropped span) to log, marked
// component=otel, instead of the standard logger's unstructured stderr.
// OpenTelemetry keeps them in process-wide state, so the last call wins.
func logOtelTo(log *slog.Logger) {
	log = log.With("component", "otel")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("telemetry", "err", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
}
