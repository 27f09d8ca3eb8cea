package node_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

func windowPolicy(name string, limit int64) node.Policy {
	return node.Policy{Name: name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: limit, Period: algorithms.MaxPeriod}}
}

// SetPolicies reports what changed, resolves the default failure mode as
// New does, and changes nothing when the new set is invalid.
func TestSetPoliciesReplacesTheSet(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{
		Policies:           []node.Policy{windowPolicy("kept", 5), windowPolicy("changed", 5), windowPolicy("removed", 5)},
		DefaultFailureMode: node.FailClosed,
	})
	ctx := context.Background()
	before := n.Policies()
	if _, err := n.SetPolicies(ctx, []node.Policy{windowPolicy("a", 1), windowPolicy("a", 2)}); !errors.Is(err, node.ErrDuplicatePolicy) {
		t.Fatalf("duplicate names: %v, want ErrDuplicatePolicy", err)
	}
	if _, err := n.SetPolicies(ctx, []node.Policy{windowPolicy("bad name", 1)}); !errors.Is(err, node.ErrInvalidPolicyName) {
		t.Fatalf("bad name: %v, want ErrInvalidPolicyName", err)
	}
	if got := n.Policies(); !slices.Equal(got, before) {
		t.Fatalf("a refused set changed the policies: %+v", got)
	}

	ch, err := n.SetPolicies(ctx, []node.Policy{windowPolicy("kept", 5), windowPolicy("changed", 6), windowPolicy("added", 1)})
	if err != nil {
		t.Fatal(err)
	}
	want := node.PolicyChanges{Added: []string{"added"}, Removed: []string{"removed"}, Changed: []string{"changed"}}
	if !slices.Equal(ch.Added, want.Added) || !slices.Equal(ch.Removed, want.Removed) || !slices.Equal(ch.Changed, want.Changed) {
		t.Fatalf("changes %+v, want %+v", ch, want)
	}
	if p, ok := n.Policy("changed"); !ok || p.Limit.Limit != 6 || p.OnStoreError != node.FailClosed {
		t.Fatalf("changed policy: %+v %v", p, ok)
	}
	if _, ok := n.Policy("removed"); ok {
		t.Fatal("removed policy still resolves")
	}
	if names := policyNames(n.Policies()); !slices.Equal(names, []string{"added", "changed", "kept"}) {
		t.Fatalf("policies %v", names)
	}
	if ch, err := n.SetPolicies(ctx, []node.Policy{windowPolicy("kept", 5), windowPolicy("changed", 6), windowPolicy("added", 1)}); err != nil || !ch.Empty() {
		t.Fatalf("the same set again: %+v, %v", ch, err)
	}
}

func policyNames(ps []node.Policy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// A check resolving several policies against one PolicySet sees them all
// from one SetPolicies call, however the swaps interleave.
func TestPolicySetIsNeverAMix(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{Policies: []node.Policy{windowPolicy("x", 1), windowPolicy("y", 1)}})
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, mixes atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := n.PolicySet()
				x, _ := s.Policy("x")
				y, _ := s.Policy("y")
				if x.Limit.Limit != y.Limit.Limit {
					mixes.Add(1)
				}
				reads.Add(1)
			}
		}()
	}
	for i := range 200 {
		limit := int64(i%2 + 1)
		if _, err := n.SetPolicies(ctx, []node.Policy{windowPolicy("x", limit), windowPolicy("y", limit)}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if mixes.Load() != 0 {
		t.Fatalf("%d of %d reads saw policies from two sets", mixes.Load(), reads.Load())
	}
}

// A policy whose limit changed loses its leases, which go back to Redis,
// and its remembered denials; a policy whose failure mode alone changed
// keeps its lease.
func TestSetPoliciesDropsLeasesAndDenialsOfChangedLimits(t *testing.T) {
	r := redistest.Start(t)
	nodes, _ := cluster(t, r, 1)
	n := nodes[0]
	ctx := context.Background()
	leased, denied, kept := windowPolicy("leased", 1000), windowPolicy("denied", 3), windowPolicy("kept", 1000)
	if _, err := n.SetPolicies(ctx, []node.Policy{leased, denied, kept}); err != nil {
		t.Fatal(err)
	}
	check := func(p node.Policy, key string) node.Result {
		t.Helper()
		res, err := n.Check(ctx, p, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for n.Stats().UnitsHeld == 0 {
		check(leased, "k")
	}
	held := n.Stats().UnitsHeld
	for n.Stats().UnitsHeld == held {
		check(kept, "k")
	}
	keptHeld := n.Stats().UnitsHeld - held
	for check(denied, "k").Allowed {
	}
	if res := check(denied, "k"); res.Source != node.SourceDeniedCache {
		t.Fatalf("the denial was not remembered: %+v", res)
	}

	leased2, denied2, kept2 := windowPolicy("leased", 2000), windowPolicy("denied", 10), kept
	kept2.OnStoreError = node.FailClosed
	returnedBefore := n.Stats().UnitsReturned
	ch, err := n.SetPolicies(ctx, []node.Policy{leased2, denied2, kept2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ch.Changed, []string{"denied", "kept", "leased"}) {
		t.Fatalf("changed %v", ch.Changed)
	}
	if got := n.Stats().UnitsHeld; got != keptHeld {
		t.Fatalf("%d units held after the swap, want only the unchanged limit's %d", got, keptHeld)
	}
	if got := n.Stats().UnitsReturned - returnedBefore; got != held {
		t.Fatalf("%d units returned, want the %d the lease held", got, held)
	}
	// Redis counted 3 of the new 10 (the denied checks spent nothing).
	if res := check(denied2, "k"); !res.Allowed || res.Source != node.SourceStore || res.Remaining != 6 {
		t.Fatalf("first check under the new limit: %+v, want allowed by the store with 6 left", res)
	}
}

// At debug level every decision is logged with the policy, a hash of the
// key (never the key), the outcome, the source and the latency; at info
// level nothing is, and a lease hit still allocates nothing.
func TestDebugLogsEachDecision(t *testing.T) {
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	level.Set(slog.LevelDebug)
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
	n, err := node.New(node.Config{}, memory.New(nil, 0), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	p := windowPolicy("api", 1)
	ctx := context.Background()
	for range 2 {
		if _, err := n.Check(ctx, p, "secret-user@example.com", 1); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", buf.String())
	}
	for i, outcome := range []string{"allowed", "denied"} {
		for _, w := range []string{"level=DEBUG", "msg=decision", "policy=api", "key_hash=" + node.KeyHash("secret-user@example.com"), "outcome=" + outcome, "source=store", "latency="} {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %q lacks %q", lines[i], w)
			}
		}
	}
	if strings.Contains(buf.String(), "secret-user") {
		t.Errorf("the key itself was logged: %s", buf.String())
	}

	level.Set(slog.LevelInfo)
	buf.Reset()
	if _, err := n.Check(ctx, p, "k", 1); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0 {
		t.Fatalf("logged at info level: %s", buf.String())
	}
}

func TestLeaseHitDoesNotAllocateWithInfoLogging(t *testing.T) {
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n, err := node.New(node.Config{Lease: node.LeaseConfig{Horizon: time.Second, Hold: time.Hour}}, remoteMemory{memory.New(nil, 0)}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	p := node.Policy{Name: "bench", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000_000_000, Period: time.Hour}}
	// As leasedNodeWith: Stats walks every lease, so it is read rarely.
	for i := 0; i%1000 != 0 || n.Stats().UnitsHeld < 100_000; i++ {
		if i > 10_000_000 {
			t.Fatal("no large lease after 10M checks")
		}
		if _, err := n.Check(context.Background(), p, "hot", 1); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := leaseHitAllocs(t, n, p); allocs != 0 {
		t.Fatalf("a lease hit with an info-level logger allocates %.1f times", allocs)
	}
}
