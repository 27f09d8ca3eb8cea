package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/envoy"
)

// CheckBatch with all_or_nothing over the wire: the batch is allowed whole
// or spends nothing, and a bad item fails the whole call.
func TestCheckBatchAllOrNothing(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, store(t), Config{},
				node.Policy{Name: "per-user", Limit: fiveAYear},
				node.Policy{Name: "per-tenant", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 3, Period: time.Hour}},
				node.Policy{Name: "jobs", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Minute}})
			c := ts.client(t, "connect")
			ctx := context.Background()
			batch := func(reqs ...*quotadv1.CheckRequest) *connect.Request[quotadv1.CheckBatchRequest] {
				return connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: reqs})
			}
			user := &quotadv1.CheckRequest{Policy: "per-user", Key: "u1"}
			tenant := &quotadv1.CheckRequest{Policy: "per-tenant", Key: "t1"}
			remaining := func(policy, key string) int64 {
				t.Helper()
				res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: policy, Key: key, Cost: new(int64)}))
				if err != nil {
					t.Fatal(err)
				}
				return res.Msg.GetRemaining()
			}

			// Three fit; the fourth is over the tenant's limit and spends
			// nothing of the user's.
			for i := range 4 {
				res, err := c.CheckBatch(ctx, batch(user, tenant))
				if err != nil {
					t.Fatal(err)
				}
				u, tn := res.Msg.GetResults()[0].GetResponse(), res.Msg.GetResults()[1].GetResponse()
				if i < 3 {
					if !u.GetAllowed() || !tn.GetAllowed() || u.GetRemaining() != int64(4-i) || tn.GetRemaining() != int64(2-i) {
						t.Fatalf("batch %d: %v, %v", i+1, u, tn)
					}
					continue
				}
				if u.GetAllowed() || tn.GetAllowed() || u.GetRetryAfter().AsDuration() != 0 || tn.GetRetryAfter().AsDuration() <= 0 || u.GetRemaining() != 2 {
					t.Fatalf("batch 4: user %v, tenant %v; want both denied, the tenant with a retry_after, the user with 2 remaining", u, tn)
				}
			}
			if r := remaining("per-user", "u1"); r != 2 {
				t.Fatalf("per-user: %d remaining, want 2", r)
			}

			// Over HTTP/JSON, the field is allOrNothing.
			status, body := postJSON(t, http1Client(t), ts.URL, "/quotad.v1.QuotaService/CheckBatch", "application/json",
				`{"allOrNothing":true,"requests":[{"policy":"per-user","key":"u2"},{"policy":"per-tenant","key":"t1"}]}`)
			if status != http.StatusOK || strings.Count(body, `"allowed":false`) != 2 {
				t.Fatalf("JSON: %d %s", status, body)
			}
			if r := remaining("per-user", "u2"); r != 5 {
				t.Fatalf("per-user u2: %d remaining after a denied JSON batch, want 5", r)
			}

			// A bad item fails the whole call with its own code, and
			// nothing is decided.
			for _, tc := range []struct {
				name    string
				reqs    []*quotadv1.CheckRequest
				code    connect.Code
				message string
			}{
				{"empty key", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3"}, {Policy: "per-user", Key: ""}},
					connect.CodeInvalidArgument, "requests[1]: key: invalid key: must not be empty"},
				{"unknown policy", []*quotadv1.CheckRequest{{Policy: "nope", Key: "u3"}, {Policy: "per-user", Key: "u3"}},
					connect.CodeNotFound, `requests[0]: policy: unknown policy "nope"`},
				{"costs of one key add up past the limit", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3", Cost: cost(3)}, {Policy: "per-user", Key: "u3", Cost: cost(3)}},
					connect.CodeInvalidArgument, "requests[1]: cost: invalid cost: with the earlier checks of policy per-user and this key, 6 in all exceeds what the limit can ever admit (5)"},
				{"a concurrency limit", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3"}, {Policy: "jobs", Key: "u3"}},
					connect.CodeInvalidArgument, "requests[1]: policy jobs: a concurrency limit cannot be part of an all-or-nothing batch; check it with Check"},
			} {
				res, err := c.CheckBatch(ctx, batch(tc.reqs...))
				assertError(t, res, err, tc.code, tc.message)
			}
			if r := remaining("per-user", "u3"); r != 5 {
				t.Fatalf("per-user u3: %d remaining after refused batches, want 5", r)
			}
			if r := remaining("jobs", "u3"); r != 1 {
				t.Fatalf("jobs u3: %d slots free after a refused batch, want 1", r)
			}
		})
	}
}

func cost(c int64) *int64 { return &c }

// fiveAYear: no window ends while a test runs.
var fiveAYear = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: algorithms.MaxPeriod}

// allOrNothingRLS serves the same rules twice: as the domain "edge", all
// or nothing, and as "plain", each descriptor on its own. Periods are long
// enough that nothing refills or rolls over while the test runs.
func allOrNothingRLS(t *testing.T) (ratelimitv3connect.RateLimitServiceClient, *sdkmetric.ManualReader) {
	t.Helper()
	policies := []node.Policy{
		{Name: "per-ip", Limit: fiveAYear},
		{Name: "shadowed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: algorithms.MaxPeriod}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Burst: 4, Period: algorithms.MaxPeriod}},
	}
	rules := []envoy.Descriptor{
		{Key: "remote_address", Policy: "per-ip"},
		{Key: "beta", Policy: "shadowed", ShadowMode: true},
		{Key: "client", Policy: "bucket"},
	}
	return fileServer(t, envoy.Config{Domains: []envoy.Domain{
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
func TestRLSAllOrNothing(t *testing.T) {
	c, reader := allOrNothingRLS(t)
	req := func(domain string, ds ...*rlscommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
	}
	// The bucket of client c1 (4) is exhausted in both domains.
	for _, domain := range []string{"edge", "plain"} {
		if res := shouldRateLimit(t, c, req(domain, withHits(desc("client", "c1"), 4))); res.GetOverallCode() != rlsOK {
			t.Fatalf("%s: exhausting the bucket: %v", domain, res)
		}
	}

	res := shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.1"), desc("client", "c1"), desc("path", "/unconfigured")))
	if res.GetOverallCode() != rlsOver {
		t.Fatalf("edge: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	wantCode(t, "edge: per-ip, given back", res.GetStatuses()[0], rlsOK, 5)
	wantCode(t, "edge: bucket", res.GetStatuses()[1], rlsOver, 0)
	wantCode(t, "edge: no rule", res.GetStatuses()[2], rlsOK, 0)
	res = shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.1")))
	wantCode(t, "edge: per-ip alone", res.GetStatuses()[0], rlsOK, 4)

	res = shouldRateLimit(t, c, req("plain", desc("remote_address", "192.0.2.1"), desc("client", "c1")))
	if res.GetOverallCode() != rlsOver {
		t.Fatalf("plain: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	wantCode(t, "plain: per-ip, spent", res.GetStatuses()[0], rlsOK, 4)

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
		if res.GetOverallCode() != rlsOver || res.GetStatuses()[tc.over].GetCode() != rlsOver {
			t.Fatalf("%s: %v", tc.name, res)
		}
	}
	res = shouldRateLimit(t, c, req("edge", desc("remote_address", "192.0.2.2"), desc("client", "c2")))
	wantCode(t, "per-ip after the refused requests", res.GetStatuses()[0], rlsOK, 4)
	wantCode(t, "bucket after the refused requests", res.GetStatuses()[1], rlsOK, 3)

	// A shadow_mode rule is decided on its own: over its limit, it denies
	// nothing.
	for i := range 2 {
		res = shouldRateLimit(t, c, req("edge", desc("beta", "on"), desc("remote_address", "192.0.2.3")))
		if res.GetOverallCode() != rlsOK {
			t.Fatalf("shadow request %d: overall %s, want OK", i+1, res.GetOverallCode())
		}
		wantCode(t, "per-ip beside a shadow rule", res.GetStatuses()[1], rlsOK, uint32(4-i))
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
