package rpc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/rpc/envoy"
)

// Envoy's rate limit service (package envoy) mounted on both front ends:
// real nodes behind the real handler, called as Envoy calls it. What the
// service decides is tested in package envoy; internal/envoycompat calls a
// quotad binary with go-control-plane's client, which cannot share a test
// binary with these generated types.

const rlsOK = rlsv3.RateLimitResponse_OK

// rlsServerPolicies: per-ip is five a minute (fixed window), shadowed one a
// minute, bucket a token bucket of 2 per 30s holding up to 4.
func rlsServerPolicies() []node.Policy {
	return []node.Policy{
		{Name: "per-ip", Limit: fiveAMinute},
		{Name: "shadowed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Minute}},
		{Name: "bucket", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Burst: 4, Period: 30 * time.Second}},
	}
}

// rlsServerConfig is the domain edge: per-ip for every remote_address but
// 10.0.0.2, which is unlimited; beta shadowed; client a bucket.
func rlsServerConfig() envoy.Config {
	return envoy.Config{Domains: []envoy.Domain{{Domain: "edge", Descriptors: []envoy.Descriptor{
		{Key: "remote_address", Policy: "per-ip"},
		{Key: "remote_address", Value: "10.0.0.2", Unlimited: true},
		{Key: "beta", Policy: "shadowed", ShadowMode: true},
		{Key: "client", Policy: "bucket"},
	}}}}
}

// desc is a descriptor of key/value pairs.
func desc(kv ...string) *rlscommonv3.RateLimitDescriptor {
	d := &rlscommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlscommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// shouldRateLimit is c's answer to req, which must not fail.
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

// Envoy's rate limit service answers on both front ends, and its errors
// leave with the codes rpc gives them: an unknown domain is NotFound, a
// malformed request InvalidArgument, naming the field; MaxBatch bounds the
// descriptors.
func TestEnvoyErrorsHaveTheirCodes(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, rlsServerConfig(), rlsServerPolicies()...), MaxBatch: 3}, rlsServerPolicies()...)
	good := func() *rlscommonv3.RateLimitDescriptor { return desc("remote_address", "192.0.2.9") }
	for front, c := range map[string]ratelimitv3connect.RateLimitServiceClient{
		"grpc-go":    ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC()),
		"connect-go": ratelimitv3connect.NewRateLimitServiceClient(http1Client(t), ts.URL),
	} {
		t.Run(front, func(t *testing.T) {
			res := shouldRateLimit(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}})
			if res.GetOverallCode() != rlsOK {
				t.Fatalf("a good request: %v", res)
			}
			for _, tc := range []struct {
				name string
				req  *rlsv3.RateLimitRequest
				code connect.Code
				want string
			}{
				{"unknown domain", &rlsv3.RateLimitRequest{Domain: "edgy", Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, connect.CodeNotFound, `domain: unknown domain "edgy": not configured on this server (configured: edge)`},
				{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlscommonv3.RateLimitDescriptor{good()}}, connect.CodeInvalidArgument, "domain: invalid request: must not be empty"},
				{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{good(), good(), good(), good()}}, connect.CodeInvalidArgument, "descriptors: invalid request: 4 descriptors; send 1 to 3"},
				{"key over 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", strings.Repeat("x", 1010))}}, connect.CodeInvalidArgument,
					"descriptors[0].entries: the domain and entries make the rate limit's key: invalid key: 1030 bytes exceeds 1024"},
			} {
				_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(tc.req))
				var ce *connect.Error
				if !errors.As(err, &ce) || ce.Code() != tc.code || !strings.HasPrefix(ce.Message(), tc.want) {
					t.Errorf("%s: got %v, want %s %q", tc.name, err, tc.code, tc.want)
				}
			}
		})
	}
}

// Without Config.Envoy, the service is not served.
func TestEnvoyNotServedUnlessConfigured(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, rlsServerPolicies()...)
	c := ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
	_, err := c.ShouldRateLimit(context.Background(), connect.NewRequest(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("remote_address", "a")}}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
}
