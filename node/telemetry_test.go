package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// spanRecorder is an SDK tracer provider that keeps every ended span in
// memory.
func spanRecorder(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// attrs flattens a span's attributes for comparison.
func attrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// children returns the ended spans whose parent is s.
func children(sr *tracetest.SpanRecorder, s sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range sr.Ended() {
		if c.Parent().SpanID() == s.SpanContext().SpanID() {
			out = append(out, c)
		}
	}
	return out
}

// lastCheckSpan returns the most recently ended quotad.check span.
func lastCheckSpan(t *testing.T, sr *tracetest.SpanRecorder) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := sr.Ended()
	for i := len(ended) - 1; i >= 0; i-- {
		if ended[i].Name() == "quotad.check" {
			return ended[i]
		}
	}
	t.Fatal("no quotad.check span ended")
	return nil
}

// wantAttrs fails the test unless s carries every attribute of want.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %s: %s = %v (%T), want %v (%T); all: %v", s.Name(), k, got[k], got[k], v, v, got)
		}
	}
}

// A check on the store path, a lease hit and a denied-cache hit each make a
// quotad.check span, a child of the caller's span, that says who decided;
// only the check that calls Redis has a child span for the call; a failed
// call marks its span and the check says it failed open.
func TestCheckSpans(t *testing.T) {
	r := redistest.Start(t)
	tp, sr := spanRecorder(t)
	n := newNode(t, newRedisStore(t, r), node.Config{Telemetry: node.Telemetry{TracerProvider: tp}})
	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	defer caller.End()

	check := func(p node.Policy, cost int64) (node.Result, sdktrace.ReadOnlySpan) {
		t.Helper()
		res, err := n.Check(ctx, p, "k", cost)
		if err != nil {
			t.Fatal(err)
		}
		s := lastCheckSpan(t, sr)
		if s.Parent().SpanID() != caller.SpanContext().SpanID() || s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Fatalf("quotad.check's parent is %v, want the caller's span %v", s.Parent(), caller.SpanContext())
		}
		return res, s
	}

	t.Run("store", func(t *testing.T) {
		p := node.Policy{Name: "plain", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Hour}}
		// The key's first check is a fresh write (a plain SET), its second
		// a script call.
		for _, op := range []string{"SET", "EVALSHA"} {
			res, s := check(p, 2)
			if res.Source != node.SourceStore {
				t.Fatalf("source %s, want store", res.Source)
			}
			wantAttrs(t, s, map[string]any{"quotad.policy": "plain", "quotad.algorithm": "token_bucket", "quotad.cost": int64(2), "quotad.allowed": true, "quotad.source": "store"})
			kids := children(sr, s)
			if len(kids) != 1 {
				t.Fatalf("%d child spans, want the Redis call", len(kids))
			}
			redis := kids[0]
			if redis.Name() != op || redis.SpanKind() != trace.SpanKindClient || redis.Status().Code == codes.Error {
				t.Fatalf("child %q kind %s status %v, want %s, client, ok", redis.Name(), redis.SpanKind(), redis.Status(), op)
			}
			wantAttrs(t, redis, map[string]any{
				"db.system.name": "redis", "db.operation.name": op, "db.stored_procedure.name": "token_bucket",
				"db.namespace": "0", "server.address": "127.0.0.1", "server.port": int64(r.Port()),
			})
		}
	})

	t.Run("lease", func(t *testing.T) {
		p := node.Policy{Name: "leased", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000_000, Period: time.Hour}}
		var granted bool
		for i := 0; ; i++ {
			if i == 1000 {
				t.Fatal("no lease hit in 1000 checks")
			}
			res, s := check(p, 1)
			if res.Source == node.SourceStore {
				for _, c := range children(sr, s) {
					if g, ok := attrs(c)["quotad.lease.granted"].(int64); ok && g > 0 {
						granted = true
					}
				}
			}
			if res.Source != node.SourceLease {
				continue
			}
			wantAttrs(t, s, map[string]any{"quotad.policy": "leased", "quotad.allowed": true, "quotad.source": "lease"})
			if kids := children(sr, s); len(kids) != 0 {
				t.Fatalf("a lease hit has %d child spans, want none (no Redis call)", len(kids))
			}
			break
		}
		if !granted {
			t.Error("no Redis span of a check before the lease hit says it took a lease (quotad.lease.granted)")
		}
	})

	t.Run("denied cache", func(t *testing.T) {
		p := node.Policy{Name: "denied", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Hour}}
		check(p, 1)
		if res, s := check(p, 1); res.Allowed || res.Source != node.SourceStore || len(children(sr, s)) != 1 {
			t.Fatalf("second check: %+v from %s with %d child spans, want a denial from Redis", res.Decision, res.Source, len(children(sr, s)))
		}
		res, s := check(p, 1)
		if res.Source != node.SourceDeniedCache {
			t.Fatalf("third check: source %s, want denied_cache", res.Source)
		}
		wantAttrs(t, s, map[string]any{"quotad.policy": "denied", "quotad.algorithm": "fixed_window", "quotad.allowed": false, "quotad.source": "denied_cache"})
		if kids := children(sr, s); len(kids) != 0 {
			t.Fatalf("a denied-cache hit has %d child spans, want none", len(kids))
		}
	})

	t.Run("fail open", func(t *testing.T) {
		r.Kill()
		defer r.Restart()
		p := node.Policy{Name: "outage", Limit: fiveAMinute, OnStoreError: node.FailOpen}
		res, s := check(p, 1)
		if res.Source != node.SourceFailOpen {
			t.Fatalf("source %s, want fail_open", res.Source)
		}
		wantAttrs(t, s, map[string]any{"quotad.allowed": true, "quotad.source": "fail_open"})
		kids := children(sr, s)
		if len(kids) != 1 || kids[0].Status().Code != codes.Error {
			t.Fatalf("want one failed Redis span, got %d", len(kids))
		}
		if et := attrs(kids[0])["error.type"]; et != "network" {
			t.Errorf("error.type %v, want network (connection refused)", et)
		}
	})
}

// Invalid input ends the check's span with an error status and counts no
// decision.
func TestRejectedCheckSpan(t *testing.T) {
	tp, sr := spanRecorder(t)
	mp, reader := meterReader(t)
	n := newNode(t, memory.New(nil, 0), node.Config{Telemetry: node.Telemetry{TracerProvider: tp, MeterProvider: mp}})
	if _, err := n.Check(context.Background(), node.Policy{Name: "p", Limit: fiveAMinute}, "k", -1); err == nil {
		t.Fatal("cost -1 accepted")
	}
	s := lastCheckSpan(t, sr)
	if s.Status().Code != codes.Error || s.Status().Description == "" {
		t.Fatalf("status %+v, want an error naming the problem", s.Status())
	}
	if got := sums(t, reader)["quotad.decisions"]; len(got) != 0 {
		t.Fatalf("decisions counted for a rejected check: %v", got)
	}
}

// meterReader is an SDK meter provider read on demand.
func meterReader(t testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, reader
}

// sums collects reader and returns every integer counter and gauge as
// instrument name → attributes (key=value,...) → value.
func sums(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var points []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				points = d.DataPoints
			case metricdata.Gauge[int64]:
				points = d.DataPoints
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points = append(points, metricdata.DataPoint[int64]{Attributes: p.Attributes, Value: int64(p.Count)})
				}
			default:
				continue
			}
			byAttrs := map[string]int64{}
			for _, p := range points {
				byAttrs[attrString(p.Attributes)] = p.Value
			}
			out[m.Name] = byAttrs
		}
	}
	return out
}

func attrString(s attribute.Set) string {
	var out string
	for i, kv := range s.ToSlice() {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprintf("%s=%s", kv.Key, kv.Value.String())
	}
	return out
}

// The metrics after a known sequence: decisions by policy, outcome and
// source, check latencies by source, Redis calls, the denied cache, the
// cluster size and the breaker hook.
func TestMetrics(t *testing.T) {
	r := redistest.Start(t)
	mp, reader := meterReader(t)
	n := newNode(t, newRedisStore(t, r), node.Config{
		Cluster:   quotadtest.SizedCluster(3),
		Breaker:   node.BreakerConfig{Failures: 1, ProbeEvery: time.Hour},
		Telemetry: node.Telemetry{MeterProvider: mp},
	})
	ctx := context.Background()
	p := node.Policy{Name: "three", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 3, Period: time.Hour}}
	for i := range 5 {
		if _, err := n.Check(ctx, p, "k", 1); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	got := sums(t, reader)
	want := map[string]map[string]int64{
		"quotad.decisions": {
			"quotad.outcome=allowed,quotad.policy=three,quotad.source=store":       3,
			"quotad.outcome=denied,quotad.policy=three,quotad.source=store":        1,
			"quotad.outcome=denied,quotad.policy=three,quotad.source=denied_cache": 1,
		},
		"quotad.check.duration":         {"quotad.source=store": 4, "quotad.source=denied_cache": 1},
		"db.client.operation.duration":  {"db.operation.name=EVALSHA,db.system.name=redis": 4},
		"quotad.denied_cache.hits":      {"": 1},
		"quotad.denied_cache.additions": {"": 1},
		"quotad.lease.grants":           {"": 0},
		"quotad.cluster.members":        {"": 3},
		"quotad.breaker.state":          {"": 0},
		"quotad.breaker.refusals":       {"": 0},
	}
	for name, series := range want {
		if fmt.Sprint(got[name]) != fmt.Sprint(series) {
			t.Errorf("%s = %v, want %v", name, got[name], series)
		}
	}
	if _, ok := got["quotad.store.errors"]; ok {
		t.Errorf("store errors without a failure: %v", got["quotad.store.errors"])
	}

	r.Kill()
	defer r.Restart()
	if res, _ := n.Check(ctx, node.Policy{Name: "down", Limit: fiveAMinute}, "k", 1); res.Source != node.SourceFailOpen {
		t.Fatalf("with Redis down: source %s", res.Source)
	}
	got = sums(t, reader)
	if e := got["quotad.store.errors"]["db.operation.name=EVALSHA,db.system.name=redis,error.type=network"]; e != 1 {
		t.Errorf("quotad.store.errors = %v, want 1 network error", got["quotad.store.errors"])
	}
	if d := got["quotad.decisions"]["quotad.outcome=allowed,quotad.policy=down,quotad.source=fail_open"]; d != 1 {
		t.Errorf("decisions = %v, want one fail_open", got["quotad.decisions"])
	}
	// One failure opens this breaker; the next check is refused without a
	// Redis call, and says why.
	if s := got["quotad.breaker.state"][""]; s != 2 {
		t.Errorf("quotad.breaker.state = %d after the breaker opened, want 2", s)
	}
	if res, _ := n.Check(ctx, node.Policy{Name: "down", Limit: fiveAMinute}, "k2", 1); res.Source != node.SourceFailOpen {
		t.Fatalf("with the breaker open: source %s", res.Source)
	}
	got = sums(t, reader)
	if r := got["quotad.breaker.refusals"][""]; r != 1 {
		t.Errorf("quotad.breaker.refusals = %v, want 1", got["quotad.breaker.refusals"])
	}
	if e := got["quotad.store.errors"]["db.operation.name=EVALSHA,db.system.name=redis,error.type=network"]; e != 1 {
		t.Errorf("quotad.store.errors = %v, want still 1 network error: a refused call never reached Redis", got["quotad.store.errors"])
	}
}

// Inline limits let clients choose policy names; past maxPolicyLabels
// (1000) distinct names, decisions are counted under "(other)".
func TestPolicyLabelsAreBounded(t *testing.T) {
	mp, reader := meterReader(t)
	n := newNode(t, memory.New(nil, 0), node.Config{
		Policies:  []node.Policy{{Name: "configured", Limit: fiveAMinute}},
		Telemetry: node.Telemetry{MeterProvider: mp},
	})
	ctx := context.Background()
	for i := range 1001 {
		if _, err := n.Check(ctx, node.Policy{Name: fmt.Sprintf("inline-%d", i), Limit: fiveAMinute}, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.Check(ctx, node.Policy{Name: "configured", Limit: fiveAMinute}, "k", 1); err != nil {
		t.Fatal(err)
	}
	// "configured" and inline-0 to inline-998 make 1000 names; inline-999
	// and inline-1000 are (other).
	d := sums(t, reader)["quotad.decisions"]
	if len(d) != 1001 {
		t.Errorf("%d series, want 1000 names and (other)", len(d))
	}
	key := func(policy string) string {
		return "quotad.outcome=allowed,quotad.policy=" + policy + ",quotad.source=store"
	}
	for name, want := range map[string]int64{"inline-0": 1, "inline-998": 1, "configured": 1, "(other)": 2, "inline-999": 0} {
		if d[key(name)] != want {
			t.Errorf("policy %q: %d decisions, want %d", name, d[key(name)], want)
		}
	}
}

// With the SDK's meter provider (no tracer), a measured lease hit still
// allocates nothing: a decision is an atomic add, and the histogram's
// attribute sets are precomputed.
func TestLeaseHitWithMetricsDoesNotAllocate(t *testing.T) {
	mp, _ := meterReader(t)
	n, p := leasedNodeWith(t, node.Telemetry{MeterProvider: mp})
	if allocs := leaseHitAllocs(t, n, p); allocs != 0 {
		t.Fatalf("a measured lease hit allocates %.1f times", allocs)
	}
}

// BenchmarkLeaseHitTelemetry is BenchmarkLeaseHit with the SDK: metrics
// only; every check traced (spans to a batching processor that discards
// them); traces sampled out by a ratio of 0.
func BenchmarkLeaseHitTelemetry(b *testing.B) {
	tracer := func(s sdktrace.Sampler) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	mp, _ := meterReader(b)
	for _, bc := range []struct {
		name string
		tel  node.Telemetry
	}{
		{"metrics", node.Telemetry{MeterProvider: mp}},
		{"traces", node.Telemetry{TracerProvider: tracer(sdktrace.AlwaysSample())}},
		{"traces+metrics", node.Telemetry{TracerProvider: tracer(sdktrace.AlwaysSample()), MeterProvider: mp}},
		{"sampled-out+metrics", node.Telemetry{TracerProvider: tracer(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))), MeterProvider: mp}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			n, p := leasedNodeWith(b, bc.tel)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := n.Check(ctx, p, "hot", 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// Client leases (AcquireLease, ReturnLease) have their own counters and
// gauges: grants, units leased and returned, and the leases outstanding.
func TestClientLeaseMetrics(t *testing.T) {
	r := redistest.Start(t)
	mp, reader := meterReader(t)
	n := newNode(t, newRedisStore(t, r), node.Config{Telemetry: node.Telemetry{MeterProvider: mp}})
	ctx := context.Background()
	p := node.Policy{Name: "big", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000, Period: time.Hour}}
	_, a, err := n.GrantLease(ctx, p, "k", 1, 100, node.LeaseReturn{})
	if err != nil || a.Units != 100 {
		t.Fatalf("GrantLease: %+v %v", a, err)
	}
	if _, b, err := n.GrantLease(ctx, p, "k2", 1, 50, node.LeaseReturn{}); err != nil || b.Units != 50 {
		t.Fatalf("GrantLease: %+v %v", b, err)
	}
	if returned, err := n.ReturnLease(ctx, a.ID, 60); err != nil || returned != 60 {
		t.Fatalf("ReturnLease: %d %v", returned, err)
	}
	got := sums(t, reader)
	want := map[string]int64{
		"quotad.client_lease.grants":         2,
		"quotad.client_lease.units.leased":   150,
		"quotad.client_lease.units.returned": 60,
		"quotad.client_lease.outstanding":    1,
		"quotad.client_lease.units.held":     50,
	}
	for name, v := range want {
		if got[name][""] != v {
			t.Errorf("%s = %v, want %d", name, got[name], v)
		}
	}
	if st := n.ClientLeaseStats(); st != (node.ClientLeaseStats{Grants: 1, UnitsHeld: 50, Granted: 2, UnitsGranted: 150, UnitsReturned: 60}) {
		t.Errorf("ClientLeaseStats %+v", st)
	}
}
