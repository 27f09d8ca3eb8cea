package rpc

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

func getStatus(t *testing.T, base string) statusJSON {
	t.Helper()
	resp, err := http.Get(base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET /status: %d %v", resp.StatusCode, resp.Header)
	}
	var out statusJSON
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkN makes n checks of key under the demo limit (an inline namespace)
// or, with limit nil, of a configured policy.
func checkN(t *testing.T, ts *testServer, policy, key string, limit *algorithms.Limit, n int) {
	t.Helper()
	c := ts.client(t, "connect")
	for range n {
		req := &quotadv1.CheckRequest{Policy: policy, Key: key}
		if limit != nil {
			req.Limit = policyToProto(node.Policy{Name: policy, Limit: *limit}).GetLimit()
		}
		if _, err := c.Check(context.Background(), connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
}

// GET /status on Redis: decisions per policy by outcome and source, the
// store's calls and breaker, the config the node runs, and the keys
// denied most.
func TestStatusPage(t *testing.T) {
	api := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 3, Period: time.Hour, Burst: 2}}
	ts := startServer(t, redisStore(t), Config{ShowKeys: true}, api)
	checkN(t, ts, "api", "abuser", nil, 6)
	checkN(t, ts, "api", "u1", nil, 2)
	checkN(t, ts, "demo", "u1", &fiveAMinute, 1)

	st := getStatus(t, ts.URL)
	if st.Store.Breaker != "closed" || st.Store.Calls == 0 || !strings.HasPrefix(st.Store.Describe, "redis ") {
		t.Errorf("store %+v, want redis with a closed breaker and some calls", st.Store)
	}
	if st.Config.Generation != nil || st.Config.Policies != 1 || len(st.Config.PoliciesSHA256) != 16 || !st.Config.InlineLimits || st.Config.LoadedAt.IsZero() {
		t.Errorf("config %+v", st.Config)
	}
	if st.Cluster.Clustered || st.Cluster.Size != 1 || len(st.Cluster.Members) != 0 || st.Keys != "shown" || st.TopDeniedWindow != "5m0s" {
		t.Errorf("cluster %+v, keys %q, window %q", st.Cluster, st.Keys, st.TopDeniedWindow)
	}
	if len(st.Policies) != 2 || st.Policies[0].Name != "api" || st.Policies[1].Name != "demo" {
		t.Fatalf("policies %+v, want api and demo", st.Policies)
	}
	a := st.Policies[0]
	if !a.Configured || a.Limit == nil || *a.Limit != (limitJSON{Algorithm: "token_bucket", Limit: 3, Period: "1h0m0s", Burst: 2}) {
		t.Errorf("api: %+v (limit %+v)", a, a.Limit)
	}
	allowed := a.Allowed.Store + a.Allowed.Lease
	denied := a.Denied.Store + a.Denied.DeniedCache
	if allowed != 4 || denied != 4 || a.Denied.Store == 0 {
		t.Errorf("api decisions: allowed %+v, denied %+v; want 2 for each key allowed, 4 denied", a.Allowed, a.Denied)
	}
	if a.TopDenied == nil || a.TopDenied.Denials != 4 || len(a.TopDenied.Keys) != 1 || a.TopDenied.Keys[0] != (topKeyJSON{Key: "abuser", Count: 4}) {
		t.Errorf("api top denied %+v, want abuser denied 4 times", a.TopDenied)
	}
	if d := st.Policies[1]; d.Configured || d.Limit != nil || d.Allowed.Store != 1 || d.TopDenied != nil {
		t.Errorf("demo: %+v, want an inline namespace with one allowed check and no denials", d)
	}
}

// By default a SHA-256 prefix stands for each key; a ConfigGeneration
// hook is what the page reports; the memory store has no breaker.
func TestStatusPageHidesKeysAndReportsTheGeneration(t *testing.T) {
	loaded := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := startServer(t, memory.New(nil, 0), Config{DisableInlineLimits: true,
		ConfigGeneration: func() (uint64, time.Time) { return 7, loaded }},
		node.Policy{Name: "login", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Hour}})
	checkN(t, ts, "login", "alice@example.com", nil, 3)
	st := getStatus(t, ts.URL)
	if st.Config.Generation == nil || *st.Config.Generation != 7 || !st.Config.LoadedAt.Equal(loaded) || st.Config.InlineLimits {
		t.Errorf("config %+v", st.Config)
	}
	if st.Store.Breaker != "none" || st.Store.Calls != 0 {
		t.Errorf("memory store %+v, want no breaker and no calls", st.Store)
	}
	want := hashKey("alice@example.com")
	if st.Keys != "sha256" || len(st.Policies) != 1 || st.Policies[0].TopDenied == nil || st.Policies[0].TopDenied.Keys[0].Key != want {
		t.Fatalf("keys %q, policies %+v; want login's top key as %s", st.Keys, st.Policies, want)
	}
	if !strings.HasPrefix(want, "sha256:") || len(want) != len("sha256:")+16 || strings.Contains(want, "alice") {
		t.Errorf("hashKey gives %q", want)
	}
}

// The console is served at GET / and under /console/ unless disabled;
// GET /status is served either way.
func TestConsoleMount(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		ts := startServer(t, memory.New(nil, 0), Config{DisableConsole: disabled})
		want := http.StatusOK
		if disabled {
			want = http.StatusNotFound
		}
		for _, path := range []string{"/", "/console/live.js"} {
			resp, err := http.Get(ts.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("console disabled %t: GET %s is %d, want %d", disabled, path, resp.StatusCode, want)
			}
		}
		getStatus(t, ts.URL)
	}
}
