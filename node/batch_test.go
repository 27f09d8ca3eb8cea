package node_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// The rules of CheckAll on the memory store, one at a time; the
// concurrent ones on Redis are in batch_redis_test.go.

// fiveAYear is five units a (365-day) year: nothing refills or rolls over
// during a test.
var fiveAYear = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: algorithms.MaxPeriod}

// remainingOf reads what a check of p on key would still admit, spending
// nothing.
func remainingOf(t *testing.T, n *node.Node, p node.Policy, key string) int64 {
	t.Helper()
	res, err := n.Check(context.Background(), p, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining
}

func checkAll(t *testing.T, n *node.Node, items ...node.Item) []node.Result {
	t.Helper()
	res, err := n.CheckAll(context.Background(), items)
	if err != nil {
		t.Fatalf("CheckAll: %v", err)
	}
	if len(res) != len(items) {
		t.Fatalf("CheckAll: %d results for %d items", len(res), len(items))
	}
	return res
}

func TestCheckAll(t *testing.T) {
	a := node.Policy{Name: "a", Limit: fiveAYear}
	b := node.Policy{Name: "b", Limit: fiveAYear}
	c := node.Policy{Name: "c", Limit: fiveAYear}
	spend := func(t *testing.T, n *node.Node, p node.Policy, cost int64) {
		t.Helper()
		if res, err := n.Check(context.Background(), p, "k", cost); err != nil || !res.Allowed {
			t.Fatalf("spend %d of %s: %+v, %v", cost, p.Name, res, err)
		}
	}

	t.Run("every item fits: each spends its cost", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		res := checkAll(t, n, node.Item{Policy: a, Key: "k", Cost: 2}, node.Item{Policy: b, Key: "k", Cost: 3})
		for i, want := range []int64{3, 2} {
			if !res[i].Allowed || res[i].Remaining != want || res[i].RetryAfter != 0 || res[i].Source != node.SourceStore {
				t.Errorf("item %d: %+v, want allowed with %d remaining", i, res[i], want)
			}
		}
		if ra, rb := remainingOf(t, n, a, "k"), remainingOf(t, n, b, "k"); ra != 3 || rb != 2 {
			t.Fatalf("remaining %d and %d, want 3 and 2", ra, rb)
		}
	})

	t.Run("one does not fit: none spends", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		spend(t, n, b, 4)
		// a is taken first (by key order) and given back; c, after b, is
		// only looked at.
		res := checkAll(t, n,
			node.Item{Policy: c, Key: "k", Cost: 1},
			node.Item{Policy: b, Key: "k", Cost: 2},
			node.Item{Policy: a, Key: "k", Cost: 2})
		for i, r := range res {
			if r.Allowed {
				t.Errorf("item %d allowed in a denied batch: %+v", i, r)
			}
		}
		if res[1].RetryAfter <= 0 || res[1].Remaining != 1 {
			t.Errorf("the item that did not fit: %+v, want a retry_after and 1 remaining", res[1])
		}
		for _, i := range []int{0, 2} {
			if res[i].RetryAfter != 0 || res[i].Remaining != 5 || res[i].Limit != 5 {
				t.Errorf("item %d fits: %+v, want retry_after 0 and 5 remaining (nothing spent)", i, res[i])
			}
		}
		if ra, rb, rc := remainingOf(t, n, a, "k"), remainingOf(t, n, b, "k"), remainingOf(t, n, c, "k"); ra != 5 || rb != 1 || rc != 5 {
			t.Fatalf("remaining a %d, b %d, c %d; want 5, 1, 5", ra, rb, rc)
		}
	})

	t.Run("an item not reached that does not fit either has a retry_after", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		spend(t, n, a, 5)
		spend(t, n, c, 3)
		res := checkAll(t, n, node.Item{Policy: a, Key: "k", Cost: 1}, node.Item{Policy: c, Key: "k", Cost: 3})
		if res[0].RetryAfter <= 0 || res[1].RetryAfter <= 0 || res[1].Remaining != 2 {
			t.Fatalf("both over their limits: %+v", res)
		}
		if rc := remainingOf(t, n, c, "k"); rc != 2 {
			t.Fatalf("c: %d remaining, want 2", rc)
		}
	})

	t.Run("a cost-0 item must fit, and spends nothing", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		res := checkAll(t, n, node.Item{Policy: a, Key: "k"}, node.Item{Policy: b, Key: "k", Cost: 1})
		if !res[0].Allowed || !res[1].Allowed || res[0].Remaining != 5 || res[1].Remaining != 4 {
			t.Fatalf("gate open: %+v", res)
		}
		spend(t, n, a, 5)
		res = checkAll(t, n, node.Item{Policy: a, Key: "k"}, node.Item{Policy: b, Key: "k", Cost: 1})
		if res[0].Allowed || res[0].RetryAfter <= 0 || res[1].Allowed || res[1].RetryAfter != 0 {
			t.Fatalf("gate closed: %+v", res)
		}
		if rb := remainingOf(t, n, b, "k"); rb != 4 {
			t.Fatalf("b: %d remaining, want 4", rb)
		}
	})

	t.Run("items of one policy and key add up", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		res := checkAll(t, n, node.Item{Policy: a, Key: "k", Cost: 2}, node.Item{Policy: b, Key: "k", Cost: 1}, node.Item{Policy: a, Key: "k", Cost: 2})
		if !res[0].Allowed || res[0] != res[2] || res[0].Remaining != 1 {
			t.Fatalf("a twice: %+v and %+v, want one decision with 1 remaining", res[0], res[2])
		}
		// 1 left: 1 + 1 does not fit, though each alone would.
		res = checkAll(t, n, node.Item{Policy: a, Key: "k", Cost: 1}, node.Item{Policy: a, Key: "k", Cost: 1})
		if res[0].Allowed || res[0].RetryAfter <= 0 {
			t.Fatalf("2 on 1 left: %+v", res[0])
		}
		_, err := n.CheckAll(context.Background(), []node.Item{{Policy: b, Key: "k", Cost: 3}, {Policy: b, Key: "other", Cost: 3}, {Policy: b, Key: "k", Cost: 3}})
		var ie *node.ItemError
		if !errors.As(err, &ie) || ie.Index != 2 || !errors.Is(err, algorithms.ErrInvalidCost) || !node.IsInvalidInput(err) {
			t.Fatalf("3 + 3 on a limit of 5: %v, want an ItemError for item 2 wrapping ErrInvalidCost", err)
		}
		t.Log(err)
		if rb := remainingOf(t, n, b, "k"); rb != 4 {
			t.Fatalf("b: %d remaining after a refused batch, want 4", rb)
		}
	})

	t.Run("an invalid item fails the call and nothing is decided", func(t *testing.T) {
		n := newNode(t, memory.New(nil, 0), node.Config{})
		for _, tc := range []struct {
			item     node.Item
			sentinel error
		}{
			{node.Item{Policy: b, Key: ""}, node.ErrInvalidKey},
			{node.Item{Policy: b, Key: "k", Cost: 6}, algorithms.ErrInvalidCost},
			{node.Item{Policy: b, Key: "k", Cost: -1}, algorithms.ErrInvalidCost},
			{node.Item{Policy: node.Policy{Name: "b c", Limit: fiveAYear}, Key: "k"}, node.ErrInvalidPolicyName},
			{node.Item{Policy: node.Policy{Name: "b"}, Key: "k"}, algorithms.ErrUnknownAlgorithm},
		} {
			_, err := n.CheckAll(context.Background(), []node.Item{{Policy: a, Key: "k", Cost: 1}, tc.item})
			var ie *node.ItemError
			if !errors.As(err, &ie) || ie.Index != 1 || !errors.Is(err, tc.sentinel) {
				t.Errorf("%+v: %v, want an ItemError for item 1 wrapping %v", tc.item, err, tc.sentinel)
			}
		}
		if ra := remainingOf(t, n, a, "k"); ra != 5 {
			t.Fatalf("a: %d remaining, want 5", ra)
		}
	})
}

// failingStore fails every call for one key: for the key bases that start
// with family (an inline limit's base may carry the limit after it).
type failingStore struct {
	node.Store
	family string
}

func (s failingStore) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	if strings.HasPrefix(r.Base, s.family) {
		return algorithms.Decision{}, algorithms.Grant{}, errFlaky
	}
	return s.Store.Acquire(ctx, r)
}

// A store failure on one item takes that item's failure mode: open lets
// the batch through without it, closed denies the batch, and what the
// others took is given back.
func TestCheckAllStoreFailureTakesTheItemsFailureMode(t *testing.T) {
	a := node.Policy{Name: "a", Limit: fiveAYear}
	for _, tc := range []struct {
		mode    node.FailureMode
		allowed bool
		source  node.Source
		left    int64
	}{{node.FailOpen, true, node.SourceFailOpen, 3}, {node.FailClosed, false, node.SourceFailClosed, 5}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			n := newNode(t, failingStore{memory.New(nil, 0), keyBase("z", "k")}, node.Config{})
			z := node.Policy{Name: "z", Limit: fiveAYear, OnStoreError: tc.mode}
			res := checkAll(t, n, node.Item{Policy: z, Key: "k", Cost: 1}, node.Item{Policy: a, Key: "k", Cost: 2})
			if res[0].Allowed != tc.allowed || res[0].Source != tc.source || res[1].Allowed != tc.allowed || res[1].Source != node.SourceStore {
				t.Fatalf("%+v", res)
			}
			if !tc.allowed && (res[0].RetryAfter != z.Limit.Period || res[1].RetryAfter != 0) {
				t.Fatalf("retry_after %s and %s; want the period for the failed item, 0 for the other", res[0].RetryAfter, res[1].RetryAfter)
			}
			if ra := remainingOf(t, n, a, "k"); ra != tc.left {
				t.Fatalf("a: %d remaining, want %d", ra, tc.left)
			}
		})
	}
}

// gatedStore holds every Acquire that spends for one key (the bases that
// start with family) until open is closed.
type gatedStore struct {
	node.Store
	family  string
	open    chan struct{}
	waiting atomic.Int64
}

func (s *gatedStore) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	if strings.HasPrefix(r.Base, s.family) && r.Cost > 0 {
		s.waiting.Add(1)
		<-s.open
	}
	return s.Store.Acquire(ctx, r)
}

// A caller that gives up mid-batch gets its context's error, and the batch
// spends nothing, even if every item would have fitted.
func TestCheckAllAbandonedSpendsNothing(t *testing.T) {
	mem := memory.New(nil, 0)
	gs := &gatedStore{Store: mem, family: keyBase("b", "k"), open: make(chan struct{})}
	n := newNode(t, gs, node.Config{})
	a := node.Policy{Name: "a", Limit: fiveAYear}
	b := node.Policy{Name: "b", Limit: fiveAYear}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err = n.CheckAll(ctx, []node.Item{{Policy: a, Key: "k", Cost: 2}, {Policy: b, Key: "k", Cost: 2}})
	}()
	// a is taken; the batch waits on b.
	waitUntil(t, 5*time.Second, "the batch to reach b", func() bool { return gs.waiting.Load() == 1 })
	if ra := remainingOf(t, n, a, "k"); ra != 3 {
		t.Fatalf("a: %d remaining while the batch holds 2, want 3", ra)
	}
	cancel()
	wg.Wait()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	close(gs.open)
	waitUntil(t, 5*time.Second, "a and b to be given back", func() bool {
		return remainingOf(t, n, a, "k") == 5 && remainingOf(t, n, b, "k") == 5
	})
}
