package node_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/nodetest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

var fiveAMinute = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}

// The helpers every test here uses, shared with node/cluster's tests.
var (
	newNode       = nodetest.New
	newRedisStore = nodetest.RedisStore
)

type countingStore = nodetest.CountingStore

// Both stores: five allowed, the sixth denied; Reset makes the key fresh;
// another key and another policy are independent.
func TestCheckAndReset(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := newNode(t, mk(), node.Config{})
			p := node.Policy{Name: "demo", Limit: fiveAMinute}
			for i := range 5 {
				res, err := n.Check(ctx, p, "u1", 1)
				if err != nil || !res.Allowed || res.Source != node.SourceStore || res.Remaining != int64(4-i) {
					t.Fatalf("check %d: %+v, %v", i+1, res, err)
				}
			}
			res, err := n.Check(ctx, p, "u1", 1)
			if err != nil || res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > time.Minute {
				t.Fatalf("sixth check: %+v, %v", res, err)
			}
			if res, _ := n.Check(ctx, p, "u2", 1); !res.Allowed {
				t.Fatal("another key was denied")
			}
			if res, _ := n.Check(ctx, node.Policy{Name: "other", Limit: fiveAMinute}, "u1", 1); !res.Allowed {
				t.Fatal("another policy was denied")
			}
			if err := n.Reset(ctx, "demo", "u1"); err != nil {
				t.Fatal(err)
			}
			if res, _ := n.Check(ctx, p, "u1", 5); !res.Allowed || res.Remaining != 0 {
				t.Fatalf("after reset: %+v", res)
			}
		})
	}
}

func TestCheckRejectsBadInput(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{})
	ctx := context.Background()
	good := node.Policy{Name: "p", Limit: fiveAMinute}
	cases := []struct {
		name string
		p    node.Policy
		key  string
		cost int64
		want error
	}{
		{"empty key", good, "", 1, node.ErrInvalidKey},
		{"long key", good, string(make([]byte, node.MaxKeyLen+1)), 1, node.ErrInvalidKey},
		{"negative cost", good, "k", -1, algorithms.ErrInvalidCost},
		{"cost above limit", good, "k", 6, algorithms.ErrInvalidCost},
		{"bad name", node.Policy{Name: "a:b", Limit: fiveAMinute}, "k", 1, node.ErrInvalidPolicyName},
		{"zero limit", node.Policy{Name: "p", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Period: time.Second}}, "k", 1, algorithms.ErrInvalidLimit},
		{"bad mode", node.Policy{Name: "p", Limit: fiveAMinute, OnStoreError: 9}, "k", 1, node.ErrInvalidFailureMode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Check(ctx, tc.p, tc.key, tc.cost)
			if !errors.Is(err, tc.want) || !node.IsInvalidInput(err) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := n.Check(ctx, good, "a key with spaces, : and {braces}", 1); err != nil {
		t.Fatalf("a key with any bytes must work: %v", err)
	}
}

// When Redis is down, each policy's failure mode decides and says so.
func TestStoreFailureTakesTheFailureMode(t *testing.T) {
	r := redistest.Start(t)
	n := newNode(t, newRedisStore(t, r), node.Config{DefaultFailureMode: node.FailClosed})
	ctx := context.Background()
	open := node.Policy{Name: "open", Limit: fiveAMinute, OnStoreError: node.FailOpen}
	closed := node.Policy{Name: "closed", Limit: fiveAMinute, OnStoreError: node.FailClosed}
	byDefault := node.Policy{Name: "default", Limit: fiveAMinute}
	if res, _ := n.Check(ctx, open, "k", 1); res.Source != node.SourceStore {
		t.Fatalf("before the kill: %+v", res)
	}
	r.Kill()
	for _, tc := range []struct {
		p       node.Policy
		allowed bool
		source  node.Source
	}{{open, true, node.SourceFailOpen}, {closed, false, node.SourceFailClosed}, {byDefault, false, node.SourceFailClosed}} {
		res, err := n.Check(ctx, tc.p, "k", 1)
		if err != nil || res.Allowed != tc.allowed || res.Source != tc.source {
			t.Errorf("%s: %+v, %v", tc.p.Name, res, err)
		}
		if !res.Allowed && res.RetryAfter <= 0 {
			t.Errorf("%s: a fail-closed denial needs a retry_after", tc.p.Name)
		}
	}
	r.Restart()
	// A restarted Redis has lost its script cache; the store reloads on NOSCRIPT.
	if res, err := n.Check(ctx, closed, "k", 1); err != nil || res.Source != node.SourceStore || !res.Allowed {
		t.Fatalf("after restart: %+v, %v", res, err)
	}
}

func TestCallerCancellationIsAnError(t *testing.T) {
	r := redistest.Start(t)
	n := newNode(t, newRedisStore(t, r), node.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Check(ctx, node.Policy{Name: "p", Limit: fiveAMinute}, "k", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestConfigValidation(t *testing.T) {
	p := node.Policy{Name: "p", Limit: fiveAMinute}
	for name, cfg := range map[string]node.Config{
		"duplicate":                  {Policies: []node.Policy{p, p}},
		"bad policy":                 {Policies: []node.Policy{{Name: "", Limit: fiveAMinute}}},
		"bad prefix":                 {KeyPrefix: "{x}"},
		"bad default":                {DefaultFailureMode: 7},
		"negative store state check": {StoreStateCheck: -time.Second},
	} {
		if _, err := node.New(cfg, memory.New(nil, 0), nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := node.New(node.Config{}, nil, nil); err == nil {
		t.Error("nil store accepted")
	}
}

// The memory store drops a key's state once its quota is fully restored.
func TestMemoryStoreForgetsRestoredKeys(t *testing.T) {
	var mu sync.Mutex
	now := time.UnixMilli(1_700_000_000_000)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := memory.New(clock, time.Millisecond)
	defer s.Close()
	ctx := context.Background()
	tb := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Second}
	d, _, _ := s.Acquire(ctx, node.AcquireRequest{Base: "{a}", Limit: tb, Cost: 10, Want: 10})
	if !d.Allowed || s.Len() != 1 {
		t.Fatalf("%+v, len %d", d, s.Len())
	}
	mu.Lock()
	now = now.Add(d.ResetAfter)
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never dropped the restored key")
		}
		time.Sleep(time.Millisecond)
	}
	if d, _, _ := s.Acquire(ctx, node.AcquireRequest{Base: "{a}", Limit: tb}); d.Remaining != 10 {
		t.Fatalf("after restore: %+v", d)
	}
}

// A check trusts a policy NewPolicy built, validates a literal, and treats
// the two alike: one limit, whichever form a check names it in.
func TestCheckTrustsNewPolicy(t *testing.T) {
	ok := node.Policy{Name: "ok", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 2, Period: time.Minute}}
	p, err := node.NewPolicy(ok)
	if err != nil {
		t.Fatal(err)
	}

	n, err := node.New(node.Config{}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	for i, q := range []node.Policy{p, ok} {
		res, err := n.Check(ctx, q, "k", 1)
		if err != nil || !res.Allowed || res.Remaining != int64(1-i) {
			t.Fatalf("check %d: %+v, %v; want allowed with %d left (one limit for both)", i, res, err, 1-i)
		}
	}
	if _, err := n.Check(ctx, node.Policy{Name: "ok"}, "k", 1); !node.IsInvalidInput(err) {
		t.Fatalf("a literal with no limit: %v, want invalid input", err)
	}
}
