package envoy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// Tests of Envoy's rate limit service on real nodes and stores, called as
// rpc's front ends call it. rpc tests the wire: the service mounted on both
// front ends and its errors' codes; internal/envoycompat calls a quotad
// binary with go-control-plane's client.

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
)

// fiveAMinute: five units per fixed 60s window.
var fiveAMinute = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}

// edgePolicies: per-ip is five a minute (fixed window), shadowed one a
// minute, bucket a token bucket of 2 per 30s holding up to 4.
func edgePolicies() []node.Policy {
	return []node.Policy{
		{Name: "per-ip", Limit: fiveAMinute},
		{Name: "shadowed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Minute}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Burst: 4, Period: 30 * time.Second}},
	}
}

// edgeConfig is the domain edge: per-ip for every remote_address but
// 10.0.0.2, which is unlimited; beta shadowed; client a bucket.
func edgeConfig() Config {
	return Config{Domains: []Domain{{Domain: "edge", Descriptors: []Descriptor{
		{Key: "remote_address", Policy: "per-ip"},
		{Key: "remote_address", Value: "10.0.0.2", Unlimited: true},
		{Key: "beta", Policy: "shadowed", ShadowMode: true},
		{Key: "client", Policy: "bucket"},
	}}}}
}

// storeFactory makes a fresh store for one test.
type storeFactory func(t *testing.T) node.Store

// stores returns the stores the service is tested on: the embedded memory
// store, and Redis on a redis-server this test starts.
func stores() map[string]storeFactory {
	return map[string]storeFactory{
		"memory": func(*testing.T) node.Store { return memory.New(nil, 0) },
		"redis": func(t *testing.T) node.Store {
			s, err := redis.New(context.Background(), redis.Config{URL: redistest.Start(t).URL(), Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

// compiled is Compile(c, policies), which must succeed.
func compiled(t testing.TB, c Config, policies ...node.Policy) *Rules {
	t.Helper()
	r, err := Compile(c, policies)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newService is the service deciding with the rules sw holds on a node with
// policies over store; requests carry up to maxDescriptors descriptors, and
// statistics go to mp (nil: none). The node closes when t ends.
func newService(t *testing.T, store node.Store, sw *Switch, maxDescriptors int, mp metric.MeterProvider, policies ...node.Policy) *Service {
	t.Helper()
	n, err := node.New(node.Config{Policies: policies}, store, nil)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	s, err := NewService(n, sw, maxDescriptors, mp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// edgeService serves edgeConfig on store, up to 3 descriptors a request.
func edgeService(t *testing.T, store node.Store) *Service {
	t.Helper()
	return newService(t, store, NewSwitch(compiled(t, edgeConfig(), edgePolicies()...)), 3, nil, edgePolicies()...)
}

// stoppingEdgeService is edgeService with StopIncrementWhenOverLimit: hits
// that do not fit are not counted.
func stoppingEdgeService(t *testing.T, store node.Store) *Service {
	t.Helper()
	c := edgeConfig()
	c.StopIncrementWhenOverLimit = true
	return newService(t, store, NewSwitch(compiled(t, c, edgePolicies()...)), 3, nil, edgePolicies()...)
}

// serviceModes are the two ways hits count: every hit (the default, as
// envoyproxy/ratelimit), or only those that fit
// (StopIncrementWhenOverLimit).
var serviceModes = []struct {
	name  string
	stop  bool
	start func(*testing.T, node.Store) *Service
}{{"every hit counts", false, edgeService}, {"stop increment when over limit", true, stoppingEdgeService}}

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

// shouldRateLimit is s's answer to req, which must not fail.
func shouldRateLimit(t *testing.T, s *Service, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	res, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(res.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("ShouldRateLimit: %d statuses for %d descriptors", len(res.GetStatuses()), len(req.GetDescriptors()))
	}
	return res
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
func TestOKThenOverLimit(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			svc := edgeService(t, store(t))
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "192.0.2.1")}}
			for i := range 5 {
				res := shouldRateLimit(t, svc, req)
				if res.GetOverallCode() != codeOK {
					t.Fatalf("request %d: overall %s", i+1, res.GetOverallCode())
				}
				wantStatus(t, "request", res.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, uint32(4-i))
				if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
					t.Errorf("request %d: duration_until_reset %s after spending, want > 0", i+1, d)
				}
			}
			for i := range 2 {
				res := shouldRateLimit(t, svc, req)
				if res.GetOverallCode() != codeOver {
					t.Fatalf("over-limit request %d: overall %s", i+1, res.GetOverallCode())
				}
				wantStatus(t, "over-limit request", res.GetStatuses()[0], codeOver, "per-ip", 5, "MINUTE", 0, 0)
				if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
					t.Errorf("over-limit request: duration_until_reset %s, want > 0", d)
				}
			}
			other := shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "192.0.2.2")}})
			wantStatus(t, "another address", other.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, 4)
		})
	}
}

// One request, several descriptors: each gets its own status, and the
// request is over the limit when any descriptor is. The third request's 2
// hits do not fit the 1 left: counted, they leave 0; not counted, 1.
func TestMultipleDescriptors(t *testing.T) {
	for _, mode := range serviceModes {
		t.Run(mode.name, func(t *testing.T) {
			svc := mode.start(t, memory.New(nil, 0))
			req := func() *rlsv3.RateLimitRequest {
				return &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 2, Descriptors: []*rlscommonv3.RateLimitDescriptor{
					desc("path", "/unconfigured"),
					desc("remote_address", "192.0.2.1"),
					desc("remote_address", "10.0.0.2"),
				}}
			}
			left := uint32(0)
			if mode.stop {
				left = 1
			}
			for i, want := range []struct {
				overall   rlsv3.RateLimitResponse_Code
				code      rlsv3.RateLimitResponse_Code
				remaining uint32
			}{{codeOK, codeOK, 3}, {codeOK, codeOK, 1}, {codeOver, codeOver, left}} {
				res := shouldRateLimit(t, svc, req())
				if res.GetOverallCode() != want.overall {
					t.Fatalf("request %d: overall %s, want %s", i+1, res.GetOverallCode(), want.overall)
				}
				st := res.GetStatuses()
				wantStatus(t, "unmatched descriptor", st[0], codeOK, "", 0, "", 0, 0)
				wantStatus(t, "limited descriptor", st[1], want.code, "per-ip", 5, "MINUTE", 0, want.remaining)
				wantStatus(t, "unlimited descriptor", st[2], codeOK, "", 0, "", 0, math.MaxUint32)
			}
		})
	}
}

// hits_addend: the request's applies to every descriptor (0 meaning 1); a
// descriptor's own overrides it, and its 0 checks without spending. Hits
// beyond what the limit can ever hold are over the limit; counted, they
// leave the counter over it (remaining 0, and the next hits denied too);
// not counted, they spend nothing.
func TestHitsAddend(t *testing.T) {
	for _, mode := range serviceModes {
		t.Run(mode.name, func(t *testing.T) {
			svc := mode.start(t, memory.New(nil, 0))
			for _, tc := range []struct {
				name            string
				req             *rlsv3.RateLimitRequest
				code, stopCode  rlsv3.RateLimitResponse_Code
				remaining, stop uint32
			}{
				{"request default is 1", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}, codeOK, codeOK, 4, 4},
				{"request hits_addend 3", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}, codeOK, codeOK, 1, 1},
				{"descriptor's 0 checks only", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 0)}}, codeOK, codeOK, 1, 1},
				{"descriptor's 1 beats the request's 3", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 1)}}, codeOK, codeOK, 0, 0},
				{"descriptor's 0 on an exhausted limit", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "a"), 0)}}, codeOver, codeOver, 0, 0},
				{"more than the limit holds", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 6, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "b")}}, codeOver, codeOver, 0, 5},
				{"descriptor's hits beyond 32 bits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{withHits(desc("remote_address", "b"), math.MaxUint64)}}, codeOver, codeOver, 0, 5},
				{"what those counted", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 5, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "b")}}, codeOver, codeOK, 0, 0},
			} {
				code, remaining := tc.code, tc.remaining
				if mode.stop {
					code, remaining = tc.stopCode, tc.stop
				}
				res := shouldRateLimit(t, svc, tc.req)
				wantStatus(t, tc.name, res.GetStatuses()[0], code, "per-ip", 5, "MINUTE", 0, remaining)
				if res.GetOverallCode() != code {
					t.Errorf("%s: overall %s, want %s", tc.name, res.GetOverallCode(), code)
				}
			}
		})
	}
}

// A shadow rule counts and reports, but answers OK; a bucket reports its
// rate and period in Envoy's terms, and its remaining capacity.
func TestShadowAndUnits(t *testing.T) {
	svc := edgeService(t, memory.New(nil, 0))
	beta := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("beta", "on")}}
	wantStatus(t, "first shadow request", shouldRateLimit(t, svc, beta).GetStatuses()[0], codeOK, "shadowed", 1, "MINUTE", 0, 0)
	res := shouldRateLimit(t, svc, beta)
	if res.GetOverallCode() != codeOK {
		t.Errorf("second shadow request: overall %s, want OK", res.GetOverallCode())
	}
	wantStatus(t, "second shadow request", res.GetStatuses()[0], codeOK, "shadowed", 1, "MINUTE", 0, 0)
	if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 {
		t.Errorf("second shadow request: duration_until_reset %s, want the real decision's (> 0)", d)
	}

	bucket := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("client", "c1")}}
	wantStatus(t, "bucket", shouldRateLimit(t, svc, bucket).GetStatuses()[0], codeOK, "bucket", 2, "SECOND", 30, 3)
}

// Malformed requests fail whole, with an input error naming the field, and
// before any descriptor spends; an unknown domain is ErrUnknownDomain.
func TestRejectsMalformedRequests(t *testing.T) {
	svc := edgeService(t, memory.New(nil, 0))
	good := func() *rlscommonv3.RateLimitDescriptor { return desc("remote_address", "192.0.2.9") }
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		kind error
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, node.ErrInvalidInput, "domain: invalid request: must not be empty"},
		{"unknown domain", &rlsv3.RateLimitRequest{Domain: "edgy", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, ErrUnknownDomain, `domain: unknown domain "edgy": not configured on this server (configured: edge)`},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, node.ErrInvalidInput, "descriptors: invalid request: 0 descriptors; send 1 to 3"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), good(), good(), good()}}, node.ErrInvalidInput, "4 descriptors; send 1 to 3"},
		{"limit override without a unit", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), {
			Entries: desc("remote_address", "1").GetEntries(),
			Limit:   &rlscommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100},
		}}}, node.ErrInvalidInput, "descriptors[1].limit.unit: invalid request: UNKNOWN is not a unit"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), {
			Entries: desc("remote_address", "1").GetEntries(), IsNegativeHits: true,
		}}}, node.ErrInvalidInput, "descriptors[1].is_negative_hits: invalid request: quotad does not refund hits"},
		{"key over 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), desc("remote_address", strings.Repeat("x", 1010))}}, node.ErrInvalidInput,
			"descriptors[1].entries: the domain and entries make the rate limit's key: invalid key: 1030 bytes exceeds 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := svc.ShouldRateLimit(context.Background(), tc.req)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v containing %q", err, tc.kind, tc.want)
			}
		})
	}
	// The good descriptor came first in every request above, and spent
	// nothing.
	res := shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}})
	wantStatus(t, "after the rejected requests", res.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, 4)
	// A long value is fine when no rule counts it: unmatched descriptors
	// have no key.
	res = shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("path", strings.Repeat("x", 2000))}})
	wantStatus(t, "long unmatched value", res.GetStatuses()[0], codeOK, "", 0, "", 0, 0)
}

// NewService refuses what it cannot serve with: no node, no switch, or no
// room for a descriptor.
func TestNewServiceRefusesMissingParts(t *testing.T) {
	n, err := node.New(node.Config{}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	sw := NewSwitch(nil)
	for name, args := range map[string]struct {
		n   *node.Node
		sw  *Switch
		max int
	}{"no node": {nil, sw, 1}, "no switch": {n, nil, 1}, "no descriptors": {n, sw, 0}} {
		if _, err := NewService(args.n, args.sw, args.max, nil); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := NewService(n, sw, 1, nil); err != nil {
		t.Fatal(err)
	}
}

// Descriptors no rule can match (no entries, an empty key) are answered OK
// without a limit, as envoyproxy/ratelimit answers them, instead of failing
// the request (Envoy would then apply failure_mode_deny to all of them);
// an empty value is a value, which the key's default rule counts.
func TestEdgeDescriptorsAnswerAsUpstream(t *testing.T) {
	svc := edgeService(t, memory.New(nil, 0))
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{
		desc("remote_address", "192.0.2.9"), {}, desc("a", "1", "", "2"),
	}}
	res := shouldRateLimit(t, svc, req)
	if res.GetOverallCode() != codeOK {
		t.Fatalf("overall %s, want OK", res.GetOverallCode())
	}
	wantStatus(t, "a good descriptor", res.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, 4)
	wantStatus(t, "no entries", res.GetStatuses()[1], codeOK, "", 0, "", 0, 0)
	wantStatus(t, "an empty key", res.GetStatuses()[2], codeOK, "", 0, "", 0, 0)
	res = shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "")}})
	wantStatus(t, "an empty value", res.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, 4)
	res = shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "")}})
	wantStatus(t, "the empty value again", res.GetStatuses()[0], codeOK, "per-ip", 5, "MINUTE", 0, 3)
}

// TestEveryHitCounts checks envoyproxy/ratelimit's sequence on both stores:
// against a limit of 10, a hit of 27 is OVER_LIMIT with limit_remaining 0;
// counted (the default), the counter is then over the limit, so a hit of 3
// after it is OVER_LIMIT with 0 remaining too, until the window ends; with
// StopIncrementWhenOverLimit the 27 spends nothing and the 3 is OK with 7
// remaining. A token bucket charged both owes 20 tokens beyond empty.
func TestEveryHitCounts(t *testing.T) {
	policies := []node.Policy{
		{Name: "tokens", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Minute}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: 10 * time.Second}},
	}
	for name, mk := range stores() {
		for _, stop := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, stop increment %v", name, stop), func(t *testing.T) {
				c := Config{StopIncrementWhenOverLimit: stop, Domains: []Domain{{Domain: "ai", Descriptors: []Descriptor{
					{Key: "model", Policy: "tokens"},
					{Key: "client", Policy: "bucket"},
				}}}}
				svc := newService(t, mk(t), NewSwitch(compiled(t, c, policies...)), 3, nil, policies...)
				hits := func(n uint32, kv ...string) *rlsv3.RateLimitResponse_DescriptorStatus {
					return shouldRateLimit(t, svc, &rlsv3.RateLimitRequest{Domain: "ai", HitsAddend: n, Descriptors: []*rlscommonv3.RateLimitDescriptor{desc(kv...)}}).GetStatuses()[0]
				}
				// Not counted, the 27 only read the counter: 10 remain.
				left := uint32(0)
				if stop {
					left = 10
				}
				wantStatus(t, "27 hits", hits(27, "model", "m"), codeOver, "tokens", 10, "MINUTE", 0, left)
				then := hits(3, "model", "m")
				bucket := hits(27, "client", "c")
				if bucket.GetCode() != codeOver || bucket.GetLimitRemaining() != left {
					t.Fatalf("27 hits on the bucket: %v, want OVER_LIMIT, %d remaining", bucket, left)
				}
				afterBucket := hits(3, "client", "c")
				if stop {
					wantStatus(t, "3 hits after 27 not counted", then, codeOK, "tokens", 10, "MINUTE", 0, 7)
					if afterBucket.GetCode() != codeOK || afterBucket.GetLimitRemaining() != 7 {
						t.Fatalf("3 hits on the bucket after 27 not counted: %v, want OK, 7 remaining", afterBucket)
					}
					return
				}
				wantStatus(t, "3 hits after 27 counted", then, codeOver, "tokens", 10, "MINUTE", 0, 0)
				// Charged 27 and 3 of 10, the bucket owes 20 tokens, refilled
				// one a second: full again after about 30 s.
				if afterBucket.GetCode() != codeOver || afterBucket.GetLimitRemaining() != 0 {
					t.Fatalf("3 hits on the bucket after 27 counted: %v, want OVER_LIMIT, 0 remaining", afterBucket)
				}
				if d := afterBucket.GetDurationUntilReset().AsDuration(); d < 28*time.Second || d > 30*time.Second {
					t.Fatalf("the bucket charged 27 then 3 of 10 is full again in %s, want about 30s (30 tokens owed at one a second)", d)
				}
			})
		}
	}
}
