package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/quotad/quotad/internal/redistest"
)

// scrape GETs /metrics and parses it as Prometheus text.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricValue returns the value of the series of family name whose labels
// are exactly labels: a counter's or gauge's value, a histogram's count.
// ok is false when there is no such series.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// After three allowed and two denied checks, /metrics shows exactly that:
// decisions by policy, outcome and source, latencies, the Redis calls, the
// denied cache, and the RPC server's own metric.
func TestMetricsAfterAKnownSequence(t *testing.T) {
	r := redistest.Start(t)
	decision := func(outcome, source string) map[string]string {
		return map[string]string{"quotad_policy": "demo", "quotad_outcome": outcome, "quotad_source": source}
	}
	for _, tc := range []struct {
		store string
		args  []string
		want  []struct {
			name   string
			labels map[string]string
			value  float64
		}
	}{
		{store: "memory", want: []struct {
			name   string
			labels map[string]string
			value  float64
		}{
			{"quotad_decisions_total", decision("allowed", "store"), 3},
			{"quotad_decisions_total", decision("denied", "store"), 2},
			{"quotad_check_duration_seconds", map[string]string{"quotad_source": "store"}, 5},
			{"quotad_denied_cache_hits_total", nil, 0},
		}},
		// On Redis the first denial is remembered, so the second is the
		// denied cache's and costs no Redis call.
		{store: "redis", args: []string{"--redis", r.URL()}, want: []struct {
			name   string
			labels map[string]string
			value  float64
		}{
			{"quotad_decisions_total", decision("allowed", "store"), 3},
			{"quotad_decisions_total", decision("denied", "store"), 1},
			{"quotad_decisions_total", decision("denied", "denied_cache"), 1},
			{"quotad_check_duration_seconds", map[string]string{"quotad_source": "store"}, 4},
			{"quotad_check_duration_seconds", map[string]string{"quotad_source": "denied_cache"}, 1},
			{"quotad_denied_cache_hits_total", nil, 1},
			{"db_client_operation_duration_seconds", map[string]string{"db_system_name": "redis", "db_operation_name": "EVALSHA"}, 4},
		}},
	} {
		t.Run(tc.store, func(t *testing.T) {
			base := startQuotad(t, tc.args...)
			// Token bucket, 3 per hour: nothing refills during the test.
			body := `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_TOKEN_BUCKET","limit":"3","period":"3600s"}}`
			for i := range 5 {
				if got := postCheck(t, base, body); *got.Allowed != (i < 3) {
					t.Fatalf("check %d: allowed %t", i+1, *got.Allowed)
				}
			}
			fams := scrape(t, base)
			common := []struct {
				name   string
				labels map[string]string
				value  float64
			}{
				{"rpc_server_call_duration_seconds", map[string]string{"rpc_method": "quotad.v1.QuotaService/Check", "rpc_response_status_code": "OK", "rpc_system_name": "connectrpc"}, 5},
				{"quotad_lease_grants_total", nil, 0},
				{"quotad_cluster_members", nil, 1},
				{"quotad_breaker_state", nil, 0},
				{"quotad_store_state_losses_total", nil, 0},
			}
			for _, w := range append(tc.want, common...) {
				got, ok := metricValue(fams, w.name, w.labels)
				if !ok || got != w.value {
					t.Errorf("%s%v = %v (present %t), want %v", w.name, w.labels, got, ok, w.value)
				}
			}
			decisions := 0
			for _, w := range tc.want {
				if w.name == "quotad_decisions_total" {
					decisions++
				}
			}
			if n := len(fams["quotad_decisions_total"].GetMetric()); n != decisions {
				t.Errorf("%d decision series, want %d", n, decisions)
			}
			if tc.store == "memory" && fams["db_client_operation_duration_seconds"] != nil {
				t.Error("Redis call metrics on the memory store")
			}
		})
	}
}

func TestMetricsCanBeTurnedOff(t *testing.T) {
	base := startQuotad(t, "--metrics=false")
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /metrics with --metrics=false: status %d, want 404", resp.StatusCode)
	}
}

// stdoutBuffer is quotad's stdout: safe for concurrent writes, and it
// signals once the first line is complete.
type stdoutBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	once      sync.Once
	firstLine chan struct{}
}

func (b *stdoutBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if bytes.IndexByte(b.buf.Bytes(), '\n') >= 0 {
		b.once.Do(func() { close(b.firstLine) })
	}
	return len(p), nil
}

func (b *stdoutBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runQuotad runs quotad in-process with getenv and returns its base URL
// and a stop function that shuts it down (flushing telemetry) and returns
// all it printed on stdout.
func runQuotad(t *testing.T, getenv func(string) string, args ...string) (string, func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &stdoutBuffer{firstLine: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), getenv, out, io.Discard)
	}()
	select {
	case <-out.firstLine:
	case err := <-done:
		cancel()
		t.Fatalf("quotad exited at start: %v", err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	base := strings.Fields(strings.TrimPrefix(first, "quotad listening on "))[0]
	var once sync.Once
	stop := func() string {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run returned %v", err)
			}
		})
		return out.String()
	}
	t.Cleanup(func() { stop() })
	return base, stop
}

// collector is an OTLP trace receiver over HTTP or gRPC that remembers the
// spans it got as name → trace ID.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string]string
	// hang, if not nil, holds every export until it is closed.
	hang chan struct{}
}

func (c *collector) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	if c.hang != nil {
		select {
		case <-c.hang:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans[s.GetName()] = hex.EncodeToString(s.GetTraceId())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) got() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spans
}

// serveHTTP starts c as an OTLP/HTTP receiver on POST /v1/traces and
// returns its base URL.
func (c *collector) serveHTTP(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, _ := c.Export(r.Context(), &req)
		out, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// serveGRPC starts c as an OTLP/gRPC receiver and returns its URL.
func (c *collector) serveGRPC(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, c)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return "http://" + ln.Addr().String()
}

// stdoutSpans reads the spans the stdout exporter printed (one JSON object
// per line after the banner) as name → trace ID.
func stdoutSpans(t *testing.T, out string) map[string]string {
	t.Helper()
	spans := map[string]string{}
	lines := bufio.NewScanner(strings.NewReader(out))
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		if !strings.HasPrefix(lines.Text(), "{") {
			continue
		}
		var s struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
			t.Fatalf("stdout line %q: %v", lines.Text(), err)
		}
		spans[s.Name] = s.SpanContext.TraceID
	}
	return spans
}

// Every exporter gets quotad's spans of a check, in the caller's trace,
// when quotad shuts down (the batching processor flushes then), whether
// chosen by flag or by the OTEL_* environment.
func TestTracesReachTheExporter(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *collector) (getenv func(string) string, args []string)
	}{
		{"stdout", func(*testing.T, *collector) (func(string) string, []string) {
			return noEnv, []string{"--trace-exporter", "stdout"}
		}},
		{"otlp-http", func(t *testing.T, c *collector) (func(string) string, []string) {
			return noEnv, []string{"--trace-exporter", "otlp-http", "--trace-endpoint", c.serveHTTP(t)}
		}},
		{"otlp-grpc", func(t *testing.T, c *collector) (func(string) string, []string) {
			return noEnv, []string{"--trace-exporter", "otlp-grpc", "--trace-endpoint", c.serveGRPC(t)}
		}},
		{"OTEL_TRACES_EXPORTER=otlp", func(t *testing.T, c *collector) (func(string) string, []string) {
			// The exporters read OTEL_EXPORTER_OTLP_* from the process
			// environment themselves.
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.serveGRPC(t))
			return os.Getenv, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &collector{spans: map[string]string{}}
			getenv, args := tc.setup(t, c)
			base, stop := runQuotad(t, getenv, args...)
			req, err := http.NewRequest(http.MethodPost, base+"/quotad.v1.QuotaService/Check",
				strings.NewReader(`{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_GCRA","limit":"5","period":"1s"}}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			out := stop()
			spans := c.got()
			if tc.name == "stdout" {
				spans = stdoutSpans(t, out)
			}
			for _, name := range []string{"quotad.v1.QuotaService/Check", "quotad.check"} {
				if spans[name] != traceID {
					t.Errorf("span %q in trace %q, want %s; got %v", name, spans[name], traceID, spans)
				}
			}
		})
	}
}

// A collector that never answers costs spans, not checks: the batching
// processor's queue (one span here) fills and further spans are dropped,
// while every check is answered.
func TestAHungCollectorDoesNotBlockChecks(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
	c := &collector{spans: map[string]string{}, hang: make(chan struct{})}
	base, stop := runQuotad(t, func(string) string { return "" }, "--trace-exporter", "otlp-grpc", "--trace-endpoint", c.serveGRPC(t))
	body := `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_GCRA","limit":"1000","period":"1s"}}`
	// The timeout only turns a hang into a failure; answers take
	// milliseconds.
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 50 {
		resp, err := client.Post(base+"/quotad.v1.QuotaService/Check", "application/json", strings.NewReader(body))
		if err != nil {
			close(c.hang)
			t.Fatalf("check %d with the collector hung: %v", i+1, err)
		}
		resp.Body.Close()
	}
	close(c.hang)
	stop()
}

func TestTraceExporterFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		flag string
		env  map[string]string
		want string
		err  string
	}{
		{want: "none"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: "none"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, want: "stdout"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: "otlp-http"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: "otlp-grpc"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: "otlp-http"},
		{flag: "stdout", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: "stdout"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: "OTEL_TRACES_EXPORTER"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}, err: "one exporter"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: "http/json"},
	} {
		got, err := telemetryConfig{TraceExporter: tc.flag}.traceExporter(func(k string) string { return tc.env[k] })
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("flag %q env %v: error %v, want one mentioning %q", tc.flag, tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("flag %q env %v: %q, %v; want %q", tc.flag, tc.env, got, err, tc.want)
		}
	}
}

func TestTelemetrySettings(t *testing.T) {
	path := writeFile(t, "q.yaml", "tracing:\n  exporter: otlp-grpc\n  endpoint: collector:4317\n  sample_ratio: 0.5\nmetrics: false\n")
	env := map[string]string{"QUOTAD_TRACE_SAMPLE_RATIO": "0.25"}
	c, err := loadConfig([]string{"--config", path, "--trace-exporter", "otlp-http"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Telemetry.TraceExporter != "otlp-http" || c.Telemetry.TraceEndpoint != "collector:4317" || c.Telemetry.Metrics ||
		c.Telemetry.TraceSampleRatio == nil || *c.Telemetry.TraceSampleRatio != 0.25 {
		t.Fatalf("telemetry %+v, want flag over env over file", c.Telemetry)
	}
	d, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Telemetry.TraceExporter != "" || d.Telemetry.TraceSampleRatio != nil || !d.Telemetry.Metrics {
		t.Fatalf("defaults: %+v", d.Telemetry)
	}

	for _, tc := range []struct {
		args []string
		file string
		want []string
	}{
		{args: []string{"--trace-exporter", "jaeger"}, want: []string{"trace exporter", "jaeger"}},
		{args: []string{"--trace-sample-ratio", "1.5"}, want: []string{"sample ratio", "1.5"}},
		{args: []string{"--trace-sample-ratio", "some"}, want: []string{"--trace-sample-ratio", "some"}},
		{args: []string{"--trace-endpoint", "ftp://x:1"}, want: []string{"trace endpoint", "ftp://x:1"}},
		{args: []string{"--trace-endpoint", "collector"}, want: []string{"trace endpoint", "host:port"}},
		{args: []string{"--metrics=sometimes"}, want: []string{"--metrics", "sometimes"}},
		{file: "tracing:\n  exporter: stdout\n  sampler: always\n", want: []string{"line 3", "sampler"}},
	} {
		args := tc.args
		if tc.file != "" {
			args = append([]string{"--config", writeFile(t, "bad.yaml", tc.file)}, args...)
		}
		_, err := loadConfig(args, func(string) string { return "" }, io.Discard)
		if err == nil {
			t.Errorf("%v %q accepted", tc.args, tc.file)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
	}
}

// OTEL_SDK_DISABLED=true turns traces and metrics off whatever the flags
// say; a bad OTEL_TRACES_EXPORTER stops quotad with an error naming it.
func TestTelemetryEnvironmentSwitches(t *testing.T) {
	tel, err := startTelemetry(context.Background(), telemetryConfig{TraceExporter: "stdout", Metrics: true},
		func(k string) string { return map[string]string{"OTEL_SDK_DISABLED": "true"}[k] }, io.Discard, slog.New(slog.DiscardHandler))
	if err != nil || tel.tracer != nil || tel.meter != nil || tel.metrics != nil {
		t.Fatalf("OTEL_SDK_DISABLED=true: %+v, %v", tel, err)
	}
	err = run(context.Background(), []string{"--listen", "127.0.0.1:0"},
		func(k string) string { return map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}[k] }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Fatalf("run with OTEL_TRACES_EXPORTER=zipkin: %v", err)
	}
}
