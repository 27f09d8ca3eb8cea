package rpc

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/rpc/envoy"
)

// End-to-end tests of Envoy's rate limit service: real nodes behind the
// real handler, called over gRPC on cleartext HTTP/2 as Envoy calls it.
// (internal/envoycompat calls a quotad binary with go-control-plane's
// client, which cannot share a test binary with these generated types.)

const (
	rlsOK   = rlsv3.RateLimitResponse_OK
	rlsOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// rlsServerPolicies: per-ip is five a minute (fixed window), shadowed one a
// minute, bucket a token bucket of 2 per 30s holding up to 4.
func rlsServerPolicies() []node.Policy {
	return []node.Policy{
		{Name: "per-ip", Limit: fiveAMinute},
		{Name: "shadowed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Minute}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Burst: 4, Period: 30 * time.Second}},
	}
}

func rlsServerConfig() envoy.Config {
	return envoy.Config{Domains: []envoy.Domain{{Domain: "edge", Descriptors: []envoy.Descriptor{
		{Key: "remote_address", Policy: "per-ip"},
		{Key: "remote_address", Value: "10.0.0.2", Unlimited: true},
		{Key: "beta", Policy: "shadowed", ShadowMode: true},
		{Key: "client", Policy: "bucket"},
	}}}}
}

func startRLSServer(t *testing.T, store node.Store) ratelimitv3connect.RateLimitServiceClient {
	t.Helper()
	ts := startServer(t, store, Config{Envoy: envoySwitch(t, rlsServerConfig(), rlsServerPolicies()...), MaxBatch: 3}, rlsServerPolicies()...)
	return ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
}

// desc is a descriptor of key/value pairs.
func desc(kv ...string) *rlscommonv3.RateLimitDescriptor {
	d := &rlscommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlscommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlscommonv3.RateLimitDescriptor, hits uint64) *rlscommonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

func shouldRateLimit(t *testing.T, c ratelimitv3connect.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	res, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(res.Msg.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("ShouldRateLimit: %d statuses for %d descriptors", len(res.Msg.GetStatuses()), len(req.GetDescriptors()))
	}
	return res.Msg
}

// wantStatus checks one descriptor's status. limit "" means no limit
// applied; mult 0 means no unit_multiplier.
func wantStatus(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, limit string, perUnit uint32, unit string, mult uint32, remaining uint32) {
	t.Helper()
	if st.GetCode() != code || st.GetLimitRemaining() != remaining {
		t.Errorf("%s: code %s, remaining %d; want %s, %d", what, st.GetCode(), st.GetLimitRemaining(), code, remaining)
	}
	cl := st.GetCurrentLimit()
	if limit == "" {
		if cl != nil || st.GetDurationUntilReset() != nil {
			t.Errorf("%s: current_limit %v, duration_until_reset %v; want neither", what, cl, st.GetDurationUntilReset())
		}
		return
	}
	if cl.GetName() != limit || cl.GetRequestsPerUnit() != perUnit || cl.GetUnit().String() != unit ||
		cl.GetUnitMultiplier().GetValue() != mult || (mult == 0) != (cl.GetUnitMultiplier() == nil) {
		t.Errorf("%s: current_limit %v; want %s, %d per %d %s", what, cl, limit, perUnit, mult, unit)
	}
	if d := st.GetDurationUntilReset(); d == nil || d.AsDuration() < 0 || d.AsDuration() > time.Minute {
		t.Errorf("%s: duration_until_reset %v; want 0 to 60s", what, d)
	}
}

// Five requests from one address are OK, counting down; the sixth is over
// the limit; another address has a counter of its own.
func TestRLSOKThenOverLimit(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			c := startRLSServer(t, store(t))
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "192.0.2.1")}}
			for i := range 5 {
				res := shouldRateLimit(t, c, req)
				if res.GetOverallCode() != rlsOK {
					t.Fatalf("request %d: overall %s", i+1, res.GetOverallCode())
				}
				wantStatus(t, "request", res.GetStatuses()[0], rlsOK, "per-ip", 5, "MINUTE", 0, uint32(4-i))
				if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
					t.Errorf("request %d: duration_until_reset %s after spending, want > 0", i+1, d)
				}
			}
			for i := range 2 {
				res := shouldRateLimit(t, c, req)
				if res.GetOverallCode() != rlsOver {
					t.Fatalf("over-limit request %d: overall %s", i+1, res.GetOverallCode())
				}
				wantStatus(t, "over-limit request", res.GetStatuses()[0], rlsOver, "per-ip", 5, "MINUTE", 0, 0)
				if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
					t.Errorf("over-limit request: duration_until_reset %s, want > 0", d)
				}
			}
			other := shouldRateLimit(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "192.0.2.2")}})
			wantStatus(t, "another address", other.GetStatuses()[0], rlsOK, "per-ip", 5, "MINUTE", 0, 4)
		})
	}
}

// One request, several descriptors: each gets its own status, and the
// request is over the limit when any descriptor is.
func TestRLSMultipleDescriptors(t *testing.T) {
	c := startRLSServer(t, memory.New(nil, 0))
	req := func() *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 2, Descriptors: []*rlscommonv3.RateLimitDescriptor{
			desc("path", "/unconfigured"),
			desc("remote_address", "192.0.2.1"),
			desc("remote_address", "10.0.0.2"),
		}}
	}
	for i, want := range []struct {
		overall   rlsv3.RateLimitResponse_Code
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{rlsOK, rlsOK, 3}, {rlsOK, rlsOK, 1}, {rlsOver, rlsOver, 1}} {
		res := shouldRateLimit(t, c, req())
		if res.GetOverallCode() != want.overall {
			t.Fatalf("request %d: overall %s, want %s", i+1, res.GetOverallCode(), want.overall)
		}
		st := res.GetStatuses()
		wantStatus(t, "unmatched descriptor", st[0], rlsOK, "", 0, "", 0, 0)
		wantStatus(t, "limited descriptor", st[1], want.code, "per-ip", 5, "MINUTE", 0, want.remaining)
		wantStatus(t, "unlimited descriptor", st[2], rlsOK, "", 0, "", 0, math.MaxUint32)
	}
}

// hits_addend: the request's applies to every descriptor (0 meaning 1); a
// descriptor's own overrides it, and its 0 checks without spending. Hits
// beyond what the limit can ever hold are over the limit and spend nothing.
func TestRLSHitsAddend(t *testing.T) {
	c := startRLSServer(t, memory.New(nil, 0))
	for _, tc := range []struct {
		name      string
		req       *rlsv3.RateLimitRequest
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{"request default is 1", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}, rlsOK, 4},
		{"request hits_addend 3", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}, rlsOK, 1},
		{"descriptor's 0 checks only", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 0)}}, rlsOK, 1},
		{"descriptor's 1 beats the request's 3", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 1)}}, rlsOK, 0},
		{"descriptor's 0 on an exhausted limit", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 0)}}, rlsOver, 0},
		{"more than the limit holds", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 6, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "b")}}, rlsOver, 5},
		{"descriptor's hits beyond 32 bits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "b"), math.MaxUint64)}}, rlsOver, 5},
		{"nothing was spent by those", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 5, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "b")}}, rlsOK, 0},
	} {
		res := shouldRateLimit(t, c, tc.req)
		wantStatus(t, tc.name, res.GetStatuses()[0], tc.code, "per-ip", 5, "MINUTE", 0, tc.remaining)
		if res.GetOverallCode() != tc.code {
			t.Errorf("%s: overall %s, want %s", tc.name, res.GetOverallCode(), tc.code)
		}
	}
}

// A shadow rule counts and reports, but answers OK; a bucket reports its
// rate and period in Envoy's terms, and its remaining capacity.
func TestRLSShadowAndUnits(t *testing.T) {
	c := startRLSServer(t, memory.New(nil, 0))
	beta := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("beta", "on")}}
	wantStatus(t, "first shadow request", shouldRateLimit(t, c, beta).GetStatuses()[0], rlsOK, "shadowed", 1, "MINUTE", 0, 0)
	res := shouldRateLimit(t, c, beta)
	if res.GetOverallCode() != rlsOK {
		t.Errorf("second shadow request: overall %s, want OK", res.GetOverallCode())
	}
	wantStatus(t, "second shadow request", res.GetStatuses()[0], rlsOK, "shadowed", 1, "MINUTE", 0, 0)
	if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
		t.Errorf("second shadow request: duration_until_reset %s, want the real decision's (> 0)", d)
	}

	bucket := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("client", "c1")}}
	wantStatus(t, "bucket", shouldRateLimit(t, c, bucket).GetStatuses()[0], rlsOK, "bucket", 2, "SECOND", 30, 3)
}

// Malformed requests fail whole, with InvalidArgument naming the field, and
// before any descriptor spends; an unknown domain is NotFound.
func TestRLSRejectsMalformedRequests(t *testing.T) {
	c := startRLSServer(t, memory.New(nil, 0))
	good := func() *rlscommonv3.RateLimitDescriptor { return desc("remote_address", "192.0.2.9") }
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code connect.Code
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, connect.CodeInvalidArgument, "domain: invalid request: must not be empty"},
		{"unknown domain", &rlsv3.RateLimitRequest{Domain: "edgy", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, connect.CodeNotFound, `domain: unknown domain "edgy": not configured on this server (configured: edge)`},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, connect.CodeInvalidArgument, "descriptors: invalid request: 0 descriptors; send 1 to 3"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), good(), good(), good()}}, connect.CodeInvalidArgument, "4 descriptors; send 1 to 3"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), {}}}, connect.CodeInvalidArgument, "descriptors[1].entries: invalid request: must not be empty"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), desc("a", "1", "", "2")}}, connect.CodeInvalidArgument, "descriptors[1].entries[1].key: invalid request: must not be empty"},
		{"empty value", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), desc("remote_address", "")}}, connect.CodeInvalidArgument, "descriptors[1].entries[0].value: invalid request: must not be empty"},
		{"limit override", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), {
			Entries: desc("remote_address", "1").GetEntries(),
			Limit:   &rlscommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100},
		}}}, connect.CodeInvalidArgument, "descriptors[1].limit: invalid request: quotad does not take limit overrides"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), {
			Entries: desc("remote_address", "1").GetEntries(), IsNegativeHits: true,
		}}}, connect.CodeInvalidArgument, "descriptors[1].is_negative_hits: invalid request: quotad does not refund hits"},
		{"key over 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), desc("remote_address", strings.Repeat("x", 1010))}}, connect.CodeInvalidArgument,
			"descriptors[1].entries: the domain and entries make the rate limit's key: invalid key: 1030 bytes exceeds 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(tc.req))
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != tc.code || !strings.Contains(ce.Message(), tc.want) {
				t.Fatalf("got %v, want %s containing %q", err, tc.code, tc.want)
			}
		})
	}
	// The good descriptor came first in every request above, and spent
	// nothing.
	res := shouldRateLimit(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}})
	wantStatus(t, "after the rejected requests", res.GetStatuses()[0], rlsOK, "per-ip", 5, "MINUTE", 0, 4)
	// A long value is fine when no rule counts it: unmatched descriptors
	// have no key.
	res = shouldRateLimit(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("path", strings.Repeat("x", 2000))}})
	wantStatus(t, "long unmatched value", res.GetStatuses()[0], rlsOK, "", 0, "", 0, 0)
}

// Without Envoy domains, the service is not served.
func TestRLSNotServedUnlessConfigured(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, rlsServerPolicies()...)
	c := ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
	_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
}
