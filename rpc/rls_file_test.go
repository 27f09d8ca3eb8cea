package rpc

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/rpc/envoy"
)

// Rules of envoyproxy/ratelimit's schema (envoy.Domain.File set) served
// end to end.

func rpu(n uint32) *uint32 { return &n }

// perUnit is a rate_limit block of n requests per unit.
func perUnit(n uint32, unit string) *envoy.RateLimit {
	return &envoy.RateLimit{Unit: unit, RequestsPerUnit: rpu(n)}
}

func fileDomain(file, domain string, ds ...envoy.Descriptor) envoy.Domain {
	return envoy.Domain{Domain: domain, File: file, Descriptors: ds}
}

// maxRLSDetails is envoy's cap on a detailed_metric rule's labels.
const maxRLSDetails = 100

// fileServer serves rules of envoyproxy/ratelimit's schema on the memory
// store, with metrics read by the returned reader.
func fileServer(t *testing.T, cfg envoy.Config, policies ...node.Policy) (ratelimitv3connect.RateLimitServiceClient, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, cfg, policies...), Telemetry: Telemetry{MeterProvider: mp}}, policies...)
	return ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC()), reader
}

func request(domain string, ds ...*rlscommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// envoyCounts reads the quotad.envoy.* counters: name → "domain/rule[/detail]" → value.
func envoyCounts(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if !strings.HasPrefix(m.Name, "quotad.envoy.") {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is %T, want a sum", m.Name, m.Data)
			}
			name := strings.TrimPrefix(m.Name, "quotad.envoy.")
			out[name] = map[string]int64{}
			for _, p := range sum.DataPoints {
				var parts []string
				for _, k := range []string{"quotad.envoy.domain", "quotad.envoy.rule", "quotad.envoy.detail"} {
					if v, ok := p.Attributes.Value(attribute.Key(k)); ok {
						parts = append(parts, v.AsString())
					}
				}
				out[name][strings.Join(parts, "/")] = p.Value
			}
		}
	}
	return out
}

// Blocked rules (requests_per_unit 0), named limits, units and shadow mode
// as envoyproxy/ratelimit answers them, with its statistics.
func TestRLSFileDecisions(t *testing.T) {
	c, reader := fileServer(t, envoy.Config{Domains: []envoy.Domain{fileDomain("edge.yaml", "edge",
		// Years, so that no window ends while the test runs.
		envoy.Descriptor{Key: "remote_address", RateLimit: perUnit(10, "year")},
		envoy.Descriptor{Key: "remote_address", Value: "50.0.0.5", RateLimit: &envoy.RateLimit{Unit: "second", RequestsPerUnit: rpu(0), Name: "banned"}},
		envoy.Descriptor{Key: "weekly", RateLimit: &envoy.RateLimit{Unit: "week", RequestsPerUnit: rpu(2), Name: "per-week"}},
		envoy.Descriptor{Key: "beta", ShadowMode: true, RateLimit: perUnit(1, "year")},
		envoy.Descriptor{Key: "tenant", DetailedMetric: true, RateLimit: perUnit(1, "minute")},
		envoy.Descriptor{Key: "bucket", RateLimit: &envoy.RateLimit{Policy: "bucket"}},
		envoy.Descriptor{Key: "free", RateLimit: &envoy.RateLimit{Unlimited: true}},
	)}}, rlsServerPolicies()...)

	// Ten a year: hits within; the last two past the near-limit ratio
	// (0.8 × 10 = 8); then over.
	for i := 1; i <= 11; i++ {
		res := shouldRateLimit(t, c, request("edge", desc("remote_address", "192.0.2.1")))
		st := res.GetStatuses()[0]
		want, remaining := rlsOK, uint32(10-i)
		if i == 11 {
			want, remaining = rlsOver, 0
		}
		if st.GetCode() != want || st.GetLimitRemaining() != remaining || res.GetOverallCode() != want {
			t.Fatalf("request %d: %v, want %s remaining %d", i, res, want, remaining)
		}
		if cl := st.GetCurrentLimit(); cl.GetName() != "" || cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_YEAR || cl.GetUnitMultiplier() != nil {
			t.Fatalf("request %d: current_limit %v, want 10 per YEAR, unnamed", i, cl)
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > 365*24*time.Hour {
			t.Fatalf("request %d: duration_until_reset %s, want (0, 365d]", i, d)
		}
	}

	// requests_per_unit 0: always over, without a counter; the reset is
	// the end of the current second.
	res := shouldRateLimit(t, c, request("edge", desc("remote_address", "50.0.0.5")))
	wantStatus(t, "blocked", res.GetStatuses()[0], rlsOver, "banned", 0, "SECOND", 0, 0)
	if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("blocked: duration_until_reset %s, want (0, 1s]", d)
	}

	res = shouldRateLimit(t, c, request("edge", desc("weekly", "w")))
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetName() != "per-week" || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_WEEK || cl.GetRequestsPerUnit() != 2 {
		t.Errorf("weekly: current_limit %v, want per-week, 2 per WEEK", cl)
	}

	// Shadow mode: OK, and counted as over the limit and shadowed.
	for i := 0; i < 3; i++ {
		res = shouldRateLimit(t, c, request("edge", desc("beta", "on")))
		if res.GetOverallCode() != rlsOK || res.GetStatuses()[0].GetCode() != rlsOK {
			t.Fatalf("shadow request %d: %v, want OK", i, res)
		}
	}

	// quotad_policy: the policy's algorithm and limit, named after it.
	res = shouldRateLimit(t, c, request("edge", desc("bucket", "b")))
	wantStatus(t, "quotad_policy", res.GetStatuses()[0], rlsOK, "bucket", 2, "SECOND", 30, 3)

	res = shouldRateLimit(t, c, request("edge", withHits(desc("free", "x"), 7)))
	wantStatus(t, "unlimited", res.GetStatuses()[0], rlsOK, "", 0, "", 0, math.MaxUint32)

	// detailed_metric: each value its own label, up to the cap.
	for i := 0; i < maxRLSDetails+5; i++ {
		shouldRateLimit(t, c, request("edge", desc("tenant", fmt.Sprint("t", i))))
	}

	got := envoyCounts(t, reader)
	for _, w := range []struct {
		metric, series string
		want           int64
	}{
		{"hits", "edge/remote_address", 11},
		{"within_limit", "edge/remote_address", 10},
		{"near_limit", "edge/remote_address", 2},
		{"over_limit", "edge/remote_address", 1},
		{"hits", "edge/remote_address_50.0.0.5", 1},
		{"over_limit", "edge/remote_address_50.0.0.5", 1},
		{"hits", "edge/beta", 3},
		{"within_limit", "edge/beta", 1},
		{"near_limit", "edge/beta", 1},
		{"over_limit", "edge/beta", 2},
		{"shadow_mode", "edge/beta", 2},
		{"hits", "edge/free", 7},
		{"hits", "edge/tenant/tenant_t0", 1},
		{"hits", "edge/tenant/tenant_t99", 1},
		{"hits", "edge/tenant/(other)", 5},
	} {
		if v := got[w.metric][w.series]; v != w.want {
			t.Errorf("%s{%s} = %d, want %d", w.metric, w.series, v, w.want)
		}
	}
	// Six rules, and the detailed one's capped details.
	if n, want := len(got["hits"]), 6+maxRLSDetails+1; n != want {
		t.Errorf("%d hits series, want %d: %v", n, want, got["hits"])
	}
}

// replaces: when one request's descriptors match a limit and one that
// replaces it, only the replacing one is decided and counted.
func TestRLSFileReplaces(t *testing.T) {
	c, reader := fileServer(t, envoy.Config{Domains: []envoy.Domain{fileDomain("r.yaml", "example7",
		envoy.Descriptor{Key: "key_1", Value: "value_1", Descriptors: []envoy.Descriptor{
			{Key: "user", Value: "bkthomps", RateLimit: &envoy.RateLimit{Name: "specific_limit", Unit: "second", RequestsPerUnit: rpu(5)}},
		}},
		envoy.Descriptor{Key: "key_2", Value: "value_2", Descriptors: []envoy.Descriptor{
			{Key: "user", Value: "bkthomps", RateLimit: &envoy.RateLimit{Replaces: []string{"specific_limit"}, Unit: "second", RequestsPerUnit: rpu(10)}},
		}},
	)}})
	one := desc("key_1", "value_1", "user", "bkthomps")
	two := desc("key_2", "value_2", "user", "bkthomps")
	res := shouldRateLimit(t, c, request("example7", one, two))
	wantStatus(t, "replaced", res.GetStatuses()[0], rlsOK, "", 0, "", 0, 0)
	if cl := res.GetStatuses()[1].GetCurrentLimit(); cl.GetRequestsPerUnit() != 10 || cl.GetName() != "" {
		t.Errorf("replacing: current_limit %v, want 10 per SECOND", cl)
	}
	// Alone, the named limit applies.
	res = shouldRateLimit(t, c, request("example7", one))
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 5 || cl.GetName() != "specific_limit" {
		t.Errorf("alone: current_limit %v, want specific_limit, 5 per SECOND", cl)
	}
	got := envoyCounts(t, reader)
	if v := got["hits"]["example7/key_1_value_1.user_bkthomps"]; v != 1 {
		t.Errorf("the replaced limit counted %d hits, want 1 (only when alone)", v)
	}
}

// The global shadow mode answers overall OK and leaves the statuses; drop-in
// mode answers OK for an unknown domain.
func TestRLSGlobalShadowAndDropIn(t *testing.T) {
	c, reader := fileServer(t, envoy.Config{ShadowMode: true, DropIn: true, Domains: []envoy.Domain{fileDomain("e.yaml", "edge",
		envoy.Descriptor{Key: "k", RateLimit: perUnit(1, "hour")},
	)}})
	shouldRateLimit(t, c, request("edge", desc("k", "v")))
	res := shouldRateLimit(t, c, request("edge", desc("k", "v")))
	if res.GetOverallCode() != rlsOK || res.GetStatuses()[0].GetCode() != rlsOver {
		t.Errorf("global shadow mode: %v, want overall OK, the status OVER_LIMIT", res)
	}
	res = shouldRateLimit(t, c, request("nowhere", desc("k", "v"), desc("a", "b")))
	for i, st := range res.GetStatuses() {
		wantStatus(t, fmt.Sprint("unknown domain, descriptor ", i), st, rlsOK, "", 0, "", 0, 0)
	}
	// Still validated.
	_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(request("nowhere", desc("k", ""))))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown domain, malformed descriptor: %v, want InvalidArgument", err)
	}
	got := envoyCounts(t, reader)
	if got["global_shadow_mode"][""] != 1 || got["domain_not_found"][""] != 2 {
		t.Errorf("global_shadow_mode %v, domain_not_found %v; want 1 and 2", got["global_shadow_mode"], got["domain_not_found"])
	}

	// Drop-in mode serves even without domains.
	empty, _ := fileServer(t, envoy.Config{DropIn: true})
	res = shouldRateLimit(t, empty, request("edge", desc("k", "v")))
	wantStatus(t, "no domains", res.GetStatuses()[0], rlsOK, "", 0, "", 0, 0)
}

// A request is decided wholly by the rules before a swap or wholly by those
// after: with swaps racing requests, both descriptors of every answer
// always name the same rule set.
func TestEnvoySwitchIsAtomic(t *testing.T) {
	compile := func(name string) *envoy.Rules {
		lim := &envoy.RateLimit{Unit: "hour", RequestsPerUnit: rpu(1 << 30), Name: name}
		r, err := envoy.Compile(envoy.Config{Domains: []envoy.Domain{fileDomain("s.yaml", "edge",
			envoy.Descriptor{Key: "a", RateLimit: lim}, envoy.Descriptor{Key: "b", RateLimit: lim},
		)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	old, next := compile("old"), compile("new")
	sw := envoy.NewSwitch(old)
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: sw})
	c := ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				sw.Swap(next)
			} else {
				sw.Swap(old)
			}
			// Pacing, not waiting: swaps stay frequent against requests
			// without the loop taking a whole core.
			time.Sleep(20 * time.Microsecond)
		}
	}()
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		res := shouldRateLimit(t, c, request("edge", desc("a", "1"), desc("b", "1")))
		x, y := res.GetStatuses()[0].GetCurrentLimit().GetName(), res.GetStatuses()[1].GetCurrentLimit().GetName()
		if x != y {
			t.Fatalf("request %d decided by two rule sets: %q and %q", i, x, y)
		}
		seen[x] = true
	}
	close(stop)
	wg.Wait()
	t.Logf("rule sets seen: %v", seen)

	// Swapping in no rules: every domain is unknown.
	sw.Swap(nil)
	_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(request("edge", desc("a", "1"))))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("after Swap(nil): %v, want NotFound", err)
	}
	if d := old.Domains(); len(d) != 1 || d[0] != "edge" {
		t.Errorf("Domains() = %v", d)
	}
}
