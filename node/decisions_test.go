package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// Without any telemetry, the node counts decisions by policy, outcome and
// source, tracks the keys it denies most, and counts the calls it sends a
// remote store.
func TestDecisionsTopDeniedAndStoreCallsWithoutTelemetry(t *testing.T) {
	api := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 2, Period: time.Hour}}
	idle := node.Policy{Name: "idle", Limit: fiveAMinute}
	n := newNode(t, remoteMemory{memory.New(nil, 0)}, node.Config{Policies: []node.Policy{api, idle}})
	inline := node.Policy{Name: "playground", Limit: fiveAMinute}

	for range 3 {
		mustCheck(t, n, api, "u1")
	}
	for range 5 {
		mustCheck(t, n, api, "abuser")
	}
	mustCheck(t, n, inline, "u1")

	byName := map[string]node.PolicyDecisions{}
	for _, d := range n.Decisions() {
		byName[d.Policy] = d
	}
	if len(byName) != 3 {
		t.Fatalf("decisions of %d policies, want api, idle and playground: %+v", len(byName), n.Decisions())
	}
	a := byName["api"]
	allowed := a.Allowed.Store + a.Allowed.Lease
	denied := a.Denied.Store + a.Denied.DeniedCache
	if !a.Configured || allowed != 4 || denied != 4 || a.Denied.Store == 0 {
		t.Errorf("api: %+v, want configured, 4 allowed and 4 denied (some by the store)", a)
	}
	if d := byName["idle"]; !d.Configured || d.Allowed != (node.SourceCounts{}) || d.Denied != (node.SourceCounts{}) {
		t.Errorf("idle: %+v, want configured with no decisions", d)
	}
	if d := byName["playground"]; d.Configured || d.Allowed.Store != 1 {
		t.Errorf("playground: %+v, want inline with one allowed by the store", d)
	}

	top := n.TopDenied()
	if len(top.Policies) != 1 || top.Policies[0].Policy != "api" || top.Policies[0].Denials != 4 {
		t.Fatalf("top denied %+v, want api with 4 denials", top)
	}
	if keys := top.Policies[0].Keys; len(keys) != 2 || keys[0].Key != "abuser" || keys[0].Count != 3 || keys[1].Key != "u1" || keys[1].Count != 1 {
		t.Errorf("top keys %+v, want abuser (3) then u1 (1)", keys)
	}

	if calls := n.Stats().StoreCalls; calls == 0 || calls > 9 {
		t.Errorf("store calls %d, want between 1 and one per check (9)", calls)
	}
	if calls := newNode(t, memory.New(nil, 0), node.Config{}).Stats().StoreCalls; calls != 0 {
		t.Errorf("memory store: %d store calls, want 0", calls)
	}
}

func mustCheck(t *testing.T, n *node.Node, p node.Policy, key string) node.Result {
	t.Helper()
	res, err := n.Check(context.Background(), p, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Counting a denial, and tracking its key, keeps a denied-cache hit free
// of allocations (TestLeaseHitDoesNotAllocate covers allowed checks).
func TestDeniedCacheHitDoesNotAllocate(t *testing.T) {
	n := newNode(t, remoteMemory{memory.New(nil, 0)}, node.Config{})
	p := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Hour}}
	for mustCheck(t, n, p, "denied").Source != node.SourceDeniedCache {
	}
	ctx := context.Background()
	if a := testing.AllocsPerRun(1000, func() {
		if res, err := n.Check(ctx, p, "denied", 1); err != nil || res.Source != node.SourceDeniedCache {
			t.Fatalf("not a denied-cache hit: %+v, %v", res, err)
		}
	}); a != 0 {
		t.Fatalf("a denied-cache hit allocates %v times", a)
	}
}
