package rpc

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/envoy"
)

func minutePolicy(name string, limit int64) node.Policy {
	return node.Policy{Name: name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: limit, Period: time.Minute}}
}

// twoRuleEnvoy limits descriptors "a" by policy pa and "b" by pb.
func twoRuleEnvoy() envoy.Config {
	return envoy.Config{Domains: []envoy.Domain{{Domain: "edge", Descriptors: []envoy.Descriptor{
		{Key: "a", Policy: "pa"}, {Key: "b", Policy: "pb"},
	}}}}
}

// compiled is envoy.Compile(c, policies), which must succeed.
func compiled(t testing.TB, c envoy.Config, policies []node.Policy) *envoy.Rules {
	t.Helper()
	r, err := envoy.Compile(c, policies)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// envoySwitch is a switch holding c compiled against policies, for
// Config.Envoy.
func envoySwitch(t testing.TB, c envoy.Config, policies ...node.Policy) *envoy.Switch {
	t.Helper()
	return envoy.NewSwitch(compiled(t, c, policies))
}

// SetRules swaps Envoy's rules: requests follow the new limits at once; a
// set that does not compile is refused before any swap, and a refused
// SetRules changes nothing; GET /cluster shows the version.
func TestSetRulesReplacesEnvoyRules(t *testing.T) {
	policies := []node.Policy{minutePolicy("pa", 100), minutePolicy("pb", 100)}
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, twoRuleEnvoy(), policies...), ConfigVersion: ConfigVersion{Generation: 1, Hash: "first"}}, policies...)
	h := ts.handler
	c := ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("a", "1")}}
	if got := shouldRateLimit(t, c, req).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 100 {
		t.Fatalf("limit %d before the swap, want 100", got)
	}
	if v := getCluster(t, ts.URL).Config; v.Generation != 1 || v.Hash != "first" || v.Policies != 2 {
		t.Fatalf("/cluster config before the swap: %+v", v)
	}

	bad := twoRuleEnvoy()
	bad.Domains[0].Descriptors[1].Policy = "nope"
	if _, err := envoy.Compile(bad, policies); !errors.Is(err, node.ErrUnknownPolicy) {
		t.Fatalf("rules naming an unknown policy: %v, want ErrUnknownPolicy", err)
	}
	if got := shouldRateLimit(t, c, req).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 100 {
		t.Fatalf("limit %d after refused rules, want 100 still", got)
	}

	next := []node.Policy{minutePolicy("pa", 7), minutePolicy("pb", 7)}
	if err := h.SetRules(Rules{Envoy: compiled(t, twoRuleEnvoy(), next), Version: ConfigVersion{Generation: 2, Hash: "second", LoadedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if got := shouldRateLimit(t, c, req).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 7 {
		t.Fatalf("limit %d after the swap, want 7", got)
	}
	if v := getCluster(t, ts.URL).Config; v.Generation != 2 || v.Hash != "second" || v.LoadedAt.IsZero() {
		t.Fatalf("/cluster config after the swap: %+v", v)
	}
}

// A handler that does not serve Envoy's service cannot start serving it
// without a restart, but still takes the version.
func TestSetRulesCannotMountEnvoyLater(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, minutePolicy("pa", 1), minutePolicy("pb", 1))
	h := ts.handler
	err := h.SetRules(Rules{Envoy: compiled(t, twoRuleEnvoy(), []node.Policy{minutePolicy("pa", 1), minutePolicy("pb", 1)}), Version: ConfigVersion{Generation: 4}})
	if !errors.Is(err, ErrRestartRequired) || !strings.Contains(err.Error(), "envoy") {
		t.Fatalf("SetRules mounting Envoy's service: %v, want ErrRestartRequired naming envoy", err)
	}
	if g := getCluster(t, ts.URL).Config.Generation; g == 4 {
		t.Fatal("a refused SetRules changed the version")
	}
	if err := h.SetRules(Rules{Version: ConfigVersion{Generation: 5}}); err != nil {
		t.Fatal(err)
	}
	if g := getCluster(t, ts.URL).Config.Generation; g != 5 {
		t.Fatalf("generation %d, want 5", g)
	}
}

// While rules and policies are swapped back and forth, every request sees
// one set whole: the two descriptors of a ShouldRateLimit, and the two
// items of a CheckBatch, always report the same limit.
func TestReloadIsNeverSeenHalfDone(t *testing.T) {
	setOf := func(limit int64) []node.Policy {
		return []node.Policy{minutePolicy("pa", limit), minutePolicy("pb", limit)}
	}
	ts := startServer(t, memory.New(nil, 0), Config{Envoy: envoySwitch(t, twoRuleEnvoy(), setOf(1000)...)}, setOf(1000)...)
	h := ts.handler
	rls := ratelimitv3connect.NewRateLimitServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
	api := ts.client(t, "grpc")
	ctx := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var requests, mixes atomic.Int64
	var failure atomic.Value
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				key := strings.Repeat("k", i+1) + string(rune('a'+k%26))
				var la, lb int64
				if i%2 == 0 {
					res, err := rls.ShouldRateLimit(ctx, connect.NewRequest(&rlsv3.RateLimitRequest{Domain: "edge",
						Descriptors: []*rlscommonv3.RateLimitDescriptor{desc("a", key), desc("b", key)}}))
					if err != nil {
						failure.Store(err)
						return
					}
					la, lb = int64(res.Msg.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()), int64(res.Msg.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit())
				} else {
					res, err := api.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{Requests: []*quotadv1.CheckRequest{
						{Policy: "pa", Key: key}, {Policy: "pb", Key: key},
					}}))
					if err != nil {
						failure.Store(err)
						return
					}
					la, lb = res.Msg.GetResults()[0].GetResponse().GetLimit(), res.Msg.GetResults()[1].GetResponse().GetLimit()
				}
				if la != lb || la == 0 {
					mixes.Add(1)
				}
				requests.Add(1)
			}
		}()
	}
	for i := 0; requests.Load() < 100 || i < 50; i++ {
		ps := setOf(int64(1000 + i%2))
		if _, err := ts.node.SetPolicies(ctx, ps); err != nil {
			t.Fatal(err)
		}
		if err := h.SetRules(Rules{Envoy: compiled(t, twoRuleEnvoy(), ps)}); err != nil {
			t.Fatal(err)
		}
		if failure.Load() != nil {
			break
		}
	}
	close(stop)
	wg.Wait()
	if err := failure.Load(); err != nil {
		t.Fatalf("a request failed during the swaps: %v", err)
	}
	if mixes.Load() != 0 {
		t.Fatalf("%d of %d requests saw limits from two sets", mixes.Load(), requests.Load())
	}
	t.Logf("%d requests during the swaps", requests.Load())
}

// A POST without a Content-Type that quotad serves, as curl -d sends it,
// gets a 415 that says what to send.
func TestUnsupportedContentTypeIsExplained(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, minutePolicy("pa", 1))
	for _, ct := range []string{"", "application/x-www-form-urlencoded", "text/plain"} {
		req, err := http.NewRequest(http.MethodPost, ts.URL+"/quotad.v1.QuotaService/Check", strings.NewReader(`{"policy":"pa","key":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http1Client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Fatalf("Content-Type %q: status %d, want 415", ct, resp.StatusCode)
		}
		for _, w := range []string{"Content-Type", "application/json"} {
			if !strings.Contains(string(body), w) {
				t.Errorf("Content-Type %q: body %q does not mention %q", ct, body, w)
			}
		}
		if resp.Header.Get("Accept-Post") == "" {
			t.Errorf("Content-Type %q: the Accept-Post header is gone", ct)
		}
	}
	// JSON still works through the same wrapper.
	resp, err := http.Post(ts.URL+"/quotad.v1.QuotaService/Check", "application/json", strings.NewReader(`{"policy":"pa","key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("JSON check: status %d", resp.StatusCode)
	}
}
