package envoy

import (
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// fiveAYear: no window ends while a test runs.
var fiveAYear = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: algorithms.MaxPeriod}

// allOrNothingService serves the same rules twice: as the domain "edge", all
// or nothing, and as "plain", each descriptor on its own. Periods are long
// enough that nothing refills or rolls over while the test runs.
func allOrNothingService(t *testing.T) (*Service, *sdkmetric.ManualReader) {
	t.Helper()
	policies := []node.Policy{
		{Name: "per-ip", Limit: fiveAYear},
		{Name: "shadowed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: algorithms.MaxPeriod}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Burst: 4, Period: algorithms.MaxPeriod}},
	}
	rules := []Descriptor{
		{Key: "remote_address", Policy: "per-ip"},
		{Key: "beta", Policy: "shadowed", ShadowMode: true},
		{Key: "client", Policy: "bucket"},
	}
	return fileService(t, Config{Domains: []Domain{
		{Domain: "edge", AllOrNothing: true, Descriptors: rules},
		{Domain: "plain", Descriptors: rules},
	}}, policies...)
}

// wantCode checks one descriptor's code and limit_remaining.
func wantCode(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, remaining uint32) {
	t.Helper()
	if st.GetCode() != code || st.GetLimitRemaining() != remaining {
		t.Errorf("%s: code %s, remaining %d; want %s, %d", what, st.GetCode(), st.GetLimitRemaining(), code, remaining)
	}
}

// Envoy's rate limit service with all_or_nothing on a domain: a request
// over any limit spends on none; off (the default), it spends on every
// descriptor that fits, as envoyproxy/ratelimit does.
func TestAllOrNothing(t *testing.T) {
	c, reader := allOrNothingService(t)
	req := func(domain string, ds ...*rlscommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
	}
	// The bucket of client c1 (4) is exhausted in both domains.
	for _, domain := range []string{"edge", "plain"} {
		if res := shouldRateLimit(t, c, req(domain, withHits(desc("client", "c1"), 4))); res.GetOverallCode() != codeOK {
			t.Fatalf("%s: exhausting the bucket: %v", domain, res)
		}
	}

	res := shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.1"), desc("client", "c1"), desc("path", "/unconfigured")))
	if res.GetOverallCode() != codeOver {
		t.Fatalf("edge: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	wantCode(t, "edge: per-ip, given back", res.GetStatuses()[0], codeOK, 5)
	wantCode(t, "edge: bucket", res.GetStatuses()[1], codeOver, 0)
	wantCode(t, "edge: no rule", res.GetStatuses()[2], codeOK, 0)
	res = shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.1")))
	wantCode(t, "edge: per-ip alone", res.GetStatuses()[0], codeOK, 4)

	res = shouldRateLimit(t, c, req("plain", desc("remote_address", "192.0.2.1"), desc("client", "c1")))
	if res.GetOverallCode() != codeOver {
		t.Fatalf("plain: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	wantCode(t, "plain: per-ip, spent", res.GetStatuses()[0], codeOK, 4)

	// Hits beyond a limit's capacity, alone or added up over descriptors
	// of one counter, are over the limit before anything is spent.
	for _, tc := range []struct {
		name string
		ds   []*rlscommonv3.RateLimitDescriptor
		over int // the descriptor over its limit
	}{
		{"one descriptor over capacity", []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "192.0.2.2"), withHits(desc("client", "c2"), 5)}, 1},
		{"one counter twice, over capacity in all", []*rlscommonv3.RateLimitDescriptor{desc("client", "c2"), withHits(desc("remote_address", "192.0.2.2"), 3), withHits(desc("remote_address", "192.0.2.2"), 3)}, 1},
	} {
		res := shouldRateLimit(t, c, req("edge", tc.ds...))
		if res.GetOverallCode() != codeOver || res.GetStatuses()[tc.over].GetCode() != codeOver {
			t.Fatalf("%s: %v", tc.name, res)
		}
	}
	res = shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.2"), desc("client", "c2")))
	wantCode(t, "per-ip after the refused requests", res.GetStatuses()[0], codeOK, 4)
	wantCode(t, "bucket after the refused requests", res.GetStatuses()[1], codeOK, 3)

	// A shadow_mode rule is decided on its own: over its limit, it denies
	// nothing.
	for i := range 2 {
		res = shouldRateLimit(t, c, req("edge", desc("beta", "on"), desc("remote_address", "192.0.2.3")))
		if res.GetOverallCode() != codeOK {
			t.Fatalf("shadow request %d: overall %s, want OK", i+1, res.GetOverallCode())
		}
		wantCode(t, "per-ip beside a shadow rule", res.GetStatuses()[1], codeOK, uint32(4-i))
	}

	// A descriptor given back counts its hits, neither within nor over
	// the limit.
	got := envoyCounts(t, reader)
	for _, w := range []struct {
		metric, series string
		want           int64
	}{
		{"hits", "edge/remote_address", 12},
		{"within_limit", "edge/remote_address", 4},
		{"over_limit", "edge/remote_address", 6},
		{"hits", "plain/remote_address", 1},
		{"within_limit", "plain/remote_address", 1},
	} {
		if v := got[w.metric][w.series]; v != w.want {
			t.Errorf("%s{%s} = %d, want %d", w.metric, w.series, v, w.want)
		}
	}
}
