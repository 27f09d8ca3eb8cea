package envoycompat

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // the matcher inputs the doc's filter names
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/internal/redistest"
)

// rlqsConfig is a quotad config serving Envoy's rate limit quota service:
// each client's bucket shares 20 a second.
const rlqsConfig = `
policies:
  - {name: per-client, algorithm: token_bucket, limit: 20, period: 1s}
rlqs:
  assignment_interval: 1s
  domains:
    - domain: edge
      buckets:
        - bucket: {name: "*"}
          policy: per-client
      default: {action: deny_all}
`

// startRLQSQuotad runs a quotad binary on r with rlqsConfig and returns
// a gRPC connection to it, and its host:port.
func startRLQSQuotad(t *testing.T, r *redistest.Server) (*grpc.ClientConn, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "quotad.yaml")
	if err := os.WriteFile(path, []byte(rlqsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--config", path, "--redis", r.URL())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, addr
}

// go-control-plane's generated client streams Envoy's reports to a quotad
// binary: the first report of a bucket is answered at once; once the
// rounds divided the policy, the bucket gets a token bucket within its
// 20 a second, alive two whole seconds, and the next rounds send the very
// same token bucket again (so Envoy keeps its bucket).
func TestRLQSStreamGetsATokenBucketFromABuiltQuotad(t *testing.T) {
	conn, addr := startRLQSQuotad(t, redistest.Start(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := &rlqsv3.BucketId{Bucket: map[string]string{"name": "alice"}}
	usage := func(elapsed time.Duration, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports {
		return &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: id, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied,
		}}}
	}
	if err := stream.Send(usage(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.GetBucketAction()) != 1 || !proto.Equal(first.GetBucketAction()[0].GetBucketId(), id) {
		t.Fatalf("the first report was answered with %v, want one action for %v", first, id)
	}
	// Periodic reports, every second, of 50 requests a second.
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if stream.Send(usage(time.Second, 20, 30)) != nil {
					return
				}
			}
		}
	}()
	var buckets []*typev3.TokenBucket
	for len(buckets) < 3 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream ended before three token buckets: %v", err)
		}
		for _, a := range m.GetBucketAction() {
			qa := a.GetQuotaAssignmentAction()
			tb := qa.GetRateLimitStrategy().GetTokenBucket()
			if tb == nil {
				continue
			}
			if got := qa.GetAssignmentTimeToLive().AsDuration(); got != 2*time.Second {
				t.Errorf("assignment_time_to_live %s, want 2s (a round of 1s and one more second)", got)
			}
			fill := tb.GetFillInterval().AsDuration()
			if fill%time.Second != 0 || fill <= 0 {
				t.Errorf("fill_interval %s is not whole seconds", fill)
			}
			rate := float64(tb.GetTokensPerFill().GetValue()) / fill.Seconds()
			if rate <= 0 || rate > 20 || tb.GetMaxTokens() == 0 {
				t.Errorf("token bucket %v: %.2f a second, want (0, 20] and max_tokens > 0", tb, rate)
			}
			buckets = append(buckets, tb)
		}
	}
	if !proto.Equal(buckets[1], buckets[2]) {
		t.Errorf("steady demand, yet the token bucket changed from %v to %v: Envoy would start a new full bucket", buckets[1], buckets[2])
	}
	// The rule's figures in /metrics: the requests reported (the first
	// report's one allowed, then 20 allowed and 30 denied a second), the
	// rate assigned, the stream.
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := string(body)
	rule := []string{"quotad_rlqs_domain=edge", "quotad_rlqs_rule=per-client"}
	allowed := metric(m, "quotad_rlqs_requests_total", append(rule, "quotad_rlqs_outcome=allowed")...)
	denied := metric(m, "quotad_rlqs_requests_total", append(rule, "quotad_rlqs_outcome=denied")...)
	if allowed < 21 || denied < 30 || (allowed-1)/20 != denied/30 {
		t.Errorf("quotad_rlqs_requests_total: allowed %g, denied %g; want 1 + 20 and 30 per report sent", allowed, denied)
	}
	if v := metric(m, "quotad_rlqs_assigned_rate_per_second", rule...); v <= 0 || v > 20 {
		t.Errorf("quotad_rlqs_assigned_rate_per_second = %g, want (0, 20]", v)
	}
	if v := metric(m, "quotad_rlqs_streams"); v != 1 {
		t.Errorf("quotad_rlqs_streams = %g, want 1", v)
	}
}

// A report naming a domain no rule configures ends the stream with
// NotFound, naming the domains that are configured.
func TestRLQSUnknownDomainEndsTheStreamSayingWhichDomainsExist(t *testing.T) {
	conn, _ := startRLQSQuotad(t, redistest.Start(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "egde", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"name": "a"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"egde"`) || !strings.Contains(err.Error(), "(edge)") {
		t.Fatalf("got %v, want NotFound naming the domain sent and the domains configured", err)
	}
}

// The rate_limit_quota filter in docs/envoy.md is Envoy's: its typed
// config, read by protojson into go-control-plane's generated
// RateLimitQuotaFilterConfig, has every field the doc writes (an unknown
// field name fails it), and the values the doc explains.
func TestRLQSFilterConfigInTheDocIsEnvoys(t *testing.T) {
	raw, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		if strings.Contains(m[1], "envoy.filters.http.rate_limit_quota") {
			block = m[1]
		}
	}
	if block == "" {
		t.Fatal("docs/envoy.md has no YAML block with the rate_limit_quota filter")
	}
	var doc struct {
		HTTPFilters []struct {
			Name        string         `yaml:"name"`
			TypedConfig map[string]any `yaml:"typed_config"`
		} `yaml:"http_filters"`
	}
	if err := yaml.Unmarshal([]byte(block), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.HTTPFilters) == 0 || doc.HTTPFilters[0].Name != "envoy.filters.http.rate_limit_quota" {
		t.Fatalf("the block's first http_filters entry is not the rate_limit_quota filter: %+v", doc.HTTPFilters)
	}
	js, err := json.Marshal(doc.HTTPFilters[0].TypedConfig)
	if err != nil {
		t.Fatal(err)
	}
	var typed anypb.Any
	if err := protojson.Unmarshal(js, &typed); err != nil {
		t.Fatalf("Envoy's proto refuses the doc's filter config: %v", err)
	}
	var cfg rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := typed.UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.GetDomain() != "edge" || cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "quotad" {
		t.Errorf("domain %q, rlqs_server %v; want edge and the cluster quotad", cfg.GetDomain(), cfg.GetRlqsServer())
	}
	matchers := cfg.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(matchers) == 0 {
		t.Fatal("no bucket_matchers")
	}
	var settings rlqsfilterv3.RateLimitQuotaBucketSettings
	if err := matchers[0].GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&settings); err != nil {
		t.Fatal(err)
	}
	if _, ok := settings.GetBucketIdBuilder().GetBucketIdBuilder()["name"]; !ok {
		t.Errorf("the bucket_id_builder makes no name entry: %v", settings.GetBucketIdBuilder())
	}
	if settings.GetReportingInterval().AsDuration() != time.Second {
		t.Errorf("reporting_interval %v, want 1s", settings.GetReportingInterval())
	}
	if settings.GetNoAssignmentBehavior().GetFallbackRateLimit() == nil || settings.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout() == nil {
		t.Errorf("no_assignment_behavior %v, expired_assignment_behavior %v: want both set", settings.GetNoAssignmentBehavior(), settings.GetExpiredAssignmentBehavior())
	}
}

// Two quotad binaries sharing one redis-server, each streamed to by one
// go-control-plane client reporting the same bucket id at 50 a second:
// once both are served, the token buckets they assign add up to at most
// the policy's 20 a second, and each gets a share.
func TestRLQSTwoBuiltQuotadsDivideOneLimit(t *testing.T) {
	r := redistest.Start(t)
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := &rlqsv3.BucketId{Bucket: map[string]string{"name": "shared"}}
	usage := func(elapsed time.Duration, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports {
		return &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: id, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied,
		}}}
	}
	for range 2 {
		conn, _ := startRLQSQuotad(t, r)
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(usage(0, 0, 1)); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	// The latest token bucket rate each stream holds, a second apart.
	rates := make([]chan float64, len(streams))
	for i, s := range streams {
		rates[i] = make(chan float64, 100)
		go func() {
			for {
				m, err := s.Recv()
				if err != nil {
					close(rates[i])
					return
				}
				for _, a := range m.GetBucketAction() {
					tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
					rate := 0.0
					if tb != nil {
						rate = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
					}
					rates[i] <- rate
				}
			}
		}()
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					if s.Send(usage(time.Second, 0, 50)) != nil {
						return
					}
				}
			}
		}()
	}
	latest := make([]float64, len(streams))
	for served := 0; served < 4; {
		for i := range rates {
			select {
			case r, ok := <-rates[i]:
				if !ok {
					t.Fatalf("stream %d ended", i)
				}
				latest[i] = r
			case <-ctx.Done():
				t.Fatal("no assignments within 60 s")
			}
		}
		if latest[0]+latest[1] > 20+1e-9 {
			t.Fatalf("the two quotads assign %.2f and %.2f a second, over the policy's 20 together", latest[0], latest[1])
		}
		if latest[0] > 0 && latest[1] > 0 {
			served++
		}
	}
	t.Logf("shares: %.2f and %.2f a second", latest[0], latest[1])
}
