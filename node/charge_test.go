package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// A charge counts what does not fit, as envoyproxy/ratelimit's INCRBY:
// under a limit of 10, a charge of 27 is denied and counted, so a charge
// of 3 after it is denied too, with nothing remaining, until the window
// ends; plain checks of 8, 5 and 2 admit the 2 (the 5 was not counted).
// A node holding a lease for the key (on Redis) does not admit from it
// after a denied charge.
func TestChargesCountWhatDoesNotFit(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			n := newNode(t, open(), node.Config{})
			ctx := context.Background()
			p := node.Policy{Name: "fw-" + name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Hour}}
			charge := node.CheckOptions{Charge: true}
			check := func(key string, cost int64, o node.CheckOptions) node.Result {
				t.Helper()
				res, err := n.CheckWith(ctx, p, key, cost, o)
				if err != nil {
					t.Fatalf("%s cost %d: %v", key, cost, err)
				}
				return res
			}

			if res := check("charged", 27, charge); res.Allowed || res.Remaining != 0 || res.ResetAfter <= 0 {
				t.Errorf("a charge of 27 under 10: %+v, want denied with nothing remaining and a reset", res.Decision)
			}
			if res := check("charged", 3, charge); res.Allowed || res.Remaining != 0 {
				t.Errorf("a charge of 3 after it: %+v, want denied (the window is over its limit)", res.Decision)
			}
			if res := check("charged", 1, node.CheckOptions{}); res.Allowed {
				t.Errorf("a plain check after them: %+v, want denied", res.Decision)
			}

			check("plain", 8, node.CheckOptions{})
			if res := check("plain", 5, node.CheckOptions{}); res.Allowed {
				t.Fatalf("a cost of 5 with 2 left was allowed")
			}
			if res := check("plain", 2, node.CheckOptions{}); !res.Allowed || res.Remaining != 0 {
				t.Errorf("a plain 2 after a denied plain 5: %+v, want allowed with 0 remaining (the 5 was not counted)", res.Decision)
			}
			check("charged-fit", 8, charge)
			if res := check("charged-fit", 5, charge); res.Allowed {
				t.Fatalf("a charge of 5 with 2 left was allowed")
			}
			if res := check("charged-fit", 2, charge); res.Allowed {
				t.Errorf("a charge of 2 after a denied charge of 5: %+v, want denied (the 5 was counted)", res.Decision)
			}

			// Leases: busy small checks (on Redis they take a lease), then a
			// charge that does not fit; nothing is admitted after it.
			busy := node.Policy{Name: "busy-" + name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 100, Period: time.Hour}}
			leaseHits := 0
			for range 40 {
				res, err := n.CheckWith(ctx, busy, "leased", 1, node.CheckOptions{})
				if err != nil || !res.Allowed {
					t.Fatalf("a busy check: %+v %v", res, err)
				}
				if res.Source == node.SourceLease {
					leaseHits++
				}
			}
			if name == "redis" && leaseHits == 0 {
				t.Fatal("no check of the busy key was answered from a lease: the test would not show what a charge does to one")
			}
			if res, err := n.CheckWith(ctx, busy, "leased", 70, charge); err != nil || res.Allowed {
				t.Fatalf("a charge of 70 with 40 of 100 spent: %+v %v, want denied", res, err)
			}
			for i := range 5 {
				if res, _ := n.CheckWith(ctx, busy, "leased", 1, node.CheckOptions{}); res.Allowed {
					t.Fatalf("check %d after the denied charge allowed from %s, want denied", i+1, res.Source)
				}
			}
		})
	}
}

// A charge is for fixed windows (the other algorithms decide cost before
// the work) and one item at a time.
func TestChargesAreRefusedWhereTheyHaveNoMeaning(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{})
	ctx := context.Background()
	tb := node.Policy{Name: "tb", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Hour}}
	if _, err := n.CheckWith(ctx, tb, "k", 1, node.CheckOptions{Charge: true}); !errors.Is(err, node.ErrInvalidInput) {
		t.Errorf("a token bucket charge: %v, want invalid input", err)
	}
	fw := node.Policy{Name: "fw", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Hour}}
	if _, err := n.CheckAllWith(ctx, []node.Item{{Policy: fw, Key: "k", Cost: 1}}, node.CheckOptions{Charge: true}); !errors.Is(err, node.ErrInvalidInput) {
		t.Errorf("an all-or-nothing charge: %v, want invalid input", err)
	}
	if _, err := n.CheckWith(ctx, fw, "k", algorithms.MaxCharge+1, node.CheckOptions{Charge: true}); err == nil {
		t.Errorf("a charge over MaxCharge was taken")
	}
}
