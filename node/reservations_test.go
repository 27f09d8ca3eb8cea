package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// A token budget of 1,000 an hour: a reservation of 500 leaves 500; settled
// with 120, 380 come back; settled again (a retry) or under an id never
// reserved, nothing changes; a reservation of 800 settled with 1,100
// charges the 300 beyond the budget, so the key owes 200 and checks are
// denied until the window ends. The same on both stores.
func TestReservationSettlesOnce(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			n := newNode(t, open(), node.Config{})
			ctx := context.Background()
			p := node.Policy{Name: "tokens-" + name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Hour}}
			reserve := func(estimate int64) (node.Result, node.Reservation) {
				t.Helper()
				res, rv, err := n.Reserve(ctx, p, "team", estimate, 0)
				if err != nil {
					t.Fatalf("reserve %d: %v", estimate, err)
				}
				return res, rv
			}
			settle := func(id string, actual int64) algorithms.Settlement {
				t.Helper()
				s, err := n.Settle(ctx, p, "team", id, actual)
				if err != nil {
					t.Fatalf("settle %d: %v", actual, err)
				}
				return s
			}

			res, rv := reserve(500)
			if !res.Allowed || res.Remaining != 500 || rv.ID == "" || rv.Lifetime != node.DefaultReservationLifetime {
				t.Fatalf("reserve 500: %+v %+v, want admitted, 500 remaining, an id", res.Decision, rv)
			}
			if s := settle(rv.ID, 120); s.Outcome != algorithms.Settled || s.Refunded != 380 || s.Charged != 0 || s.After.Remaining != 880 {
				t.Fatalf("settle 120: %+v, want settled, 380 refunded, 880 remaining", s)
			}
			if s := settle(rv.ID, 999); s.Outcome != algorithms.SettledBefore || s.Recorded != 120 || s.Refunded != 0 || s.After.Remaining != 880 {
				t.Fatalf("settle again: %+v, want settled before with 120, nothing changed", s)
			}
			if s := settle("never-reserved", 5); s.Outcome != algorithms.NoReservation || s.After.Remaining != 880 {
				t.Fatalf("settle an unknown id: %+v, want no reservation, nothing changed", s)
			}

			res, rv = reserve(800)
			if !res.Allowed || res.Remaining != 80 {
				t.Fatalf("reserve 800: %+v, want admitted with 80 remaining", res.Decision)
			}
			s := settle(rv.ID, 1100)
			if s.Outcome != algorithms.Settled || s.Charged != 300 || s.After.Allowed || s.After.Remaining != 0 || s.After.RetryAfter <= 0 {
				t.Fatalf("settle 1100 of 800: %+v, want 300 charged into debt, denied with a wait", s)
			}
			if res, err := n.Check(ctx, p, "team", 1); err != nil || res.Allowed {
				t.Fatalf("a check in debt: %+v, %v; want denied", res.Decision, err)
			}
			if res, rv := reserve(1); res.Allowed || rv.ID != "" {
				t.Fatalf("a reservation in debt: %+v %+v; want denied without an id", res.Decision, rv)
			}
		})
	}
}

// Reservations refuse what they cannot mean, naming the field.
func TestReservationsRefuseWhatTheyCannotMean(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{})
	ctx := context.Background()
	fw := node.Policy{Name: "fw", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Minute}}
	cc := node.Policy{Name: "cc", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 10, Period: time.Minute}}
	for name, tc := range map[string]struct {
		err  error
		want string
		call func() error
	}{
		"a lifetime of 25 hours":     {node.ErrInvalidReservation, "lifetime", func() error { _, _, err := n.Reserve(ctx, fw, "k", 1, 25*time.Hour); return err }},
		"an estimate over the limit": {algorithms.ErrInvalidCost, "cost", func() error { _, _, err := n.Reserve(ctx, fw, "k", 11, 0); return err }},
		"a concurrency limit":        {node.ErrConcurrencyReservation, "concurrency", func() error { _, _, err := n.Reserve(ctx, cc, "k", 1, 0); return err }},
		"an empty id":                {node.ErrInvalidReservation, "reservation_id", func() error { _, err := n.Settle(ctx, fw, "k", "", 1); return err }},
		"an actual past MaxCharge": {algorithms.ErrInvalidCost, "actual", func() error {
			_, err := n.Settle(ctx, fw, "k", "x", fw.Limit.MaxCharge()+1)
			return err
		}},
	} {
		if err := tc.call(); !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v naming %q", name, err, tc.err, tc.want)
		}
	}
}

// budgetPolicies are a token budget under every algorithm that settles,
// 100,000 units over a year: nothing refills or turns during a test, so
// what a key has used is its limit minus its remaining.
func budgetPolicies() []node.Policy {
	var ps []node.Policy
	for _, a := range algorithms.Algorithms() {
		ps = append(ps, node.Policy{Name: "budget-" + a.String(), Limit: algorithms.Limit{Algorithm: a, Limit: 100_000, Period: algorithms.MaxPeriod}})
	}
	return ps
}

// Three nodes on one redis-server take reservations of random estimates
// from many clients, settle them at random nodes with random actuals
// (below, at and above the estimate), retry a share of the settles and
// never settle another share. For every algorithm the authority's
// recorded usage is exactly the settled actuals plus the unsettled
// estimates: nothing lost, nothing counted twice.
func TestReservationsAreExactAcrossNodes(t *testing.T) {
	r := redistest.Start(t)
	ps := budgetPolicies()
	cfg := node.Config{Policies: ps, Cluster: quotadtest.SizedCluster(3)}
	ns := make([]*node.Node, 3)
	for i := range ns {
		var err error
		if ns[i], err = node.New(cfg, newRedisStore(t, r), nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns[i].Close() })
	}
	ctx := context.Background()
	for _, p := range ps {
		t.Run(p.Limit.Algorithm.String(), func(t *testing.T) {
			var want, retried, unsettled atomic.Int64
			var wg sync.WaitGroup
			var failure atomic.Value
			for w := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), uint64(p.Limit.Algorithm)))
					for range 30 {
						estimate := 1 + rng.Int64N(100)
						res, rv, err := ns[rng.IntN(3)].Reserve(ctx, p, "team", estimate, time.Minute)
						if err != nil || !res.Allowed || rv.ID == "" {
							failure.Store(fmt.Sprintf("reserve %d: %+v %+v %v", estimate, res, rv, err))
							return
						}
						if rng.IntN(8) == 0 {
							want.Add(estimate)
							unsettled.Add(1)
							continue
						}
						actual := rng.Int64N(2 * estimate)
						s, err := ns[rng.IntN(3)].Settle(ctx, p, "team", rv.ID, actual)
						if err != nil || s.Outcome != algorithms.Settled {
							failure.Store(fmt.Sprintf("settle: %+v %v", s, err))
							return
						}
						want.Add(actual)
						if rng.IntN(4) == 0 {
							// A retry after a lost reply, with another actual.
							s, err := ns[rng.IntN(3)].Settle(ctx, p, "team", rv.ID, actual+7)
							if err != nil || s.Outcome != algorithms.SettledBefore || s.Recorded != actual {
								failure.Store(fmt.Sprintf("settle again: %+v %v", s, err))
								return
							}
							retried.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if f := failure.Load(); f != nil {
				t.Fatal(f)
			}
			res, err := ns[0].Check(ctx, p, "team", 0)
			if err != nil {
				t.Fatal(err)
			}
			used := p.Limit.Limit - res.Remaining
			t.Logf("used %d, want %d (%d settles retried, %d never settled)", used, want.Load(), retried.Load(), unsettled.Load())
			if used != want.Load() || retried.Load() == 0 || unsettled.Load() == 0 {
				t.Fatalf("the authority recorded %d units; want the settled actuals plus the unsettled estimates, %d", used, want.Load())
			}
		})
	}
}

// Many clients reserve and overspend a small budget through three nodes:
// the units actually used exceed the limit by no more than the overage
// (actual beyond estimate) of the reservations still in flight when the
// last reservation was admitted, the bound the Guarantees state.
func TestOverspendIsBoundedByTheOverageInFlight(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "small", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: algorithms.MaxPeriod}}
	cfg := node.Config{Policies: []node.Policy{p}, Cluster: quotadtest.SizedCluster(3)}
	ns := make([]*node.Node, 3)
	for i := range ns {
		var err error
		if ns[i], err = node.New(cfg, newRedisStore(t, r), nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns[i].Close() })
	}
	type done struct {
		overage int64
		settled time.Time
	}
	var mu sync.Mutex
	var lastAdmitted time.Time
	var used int64
	var settles []done
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range 40 {
				start := time.Now()
				res, rv, err := ns[rng.IntN(3)].Reserve(ctx, p, "k", 10, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Allowed {
					continue
				}
				mu.Lock()
				if start.After(lastAdmitted) {
					lastAdmitted = start
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // the work
				actual := 20 + rng.Int64N(10)                             // always over the estimate: the budget is overspent
				if _, err := ns[rng.IntN(3)].Settle(ctx, p, "k", rv.ID, actual); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				used += actual
				settles = append(settles, done{max(0, actual-10), time.Now()})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var inFlight int64
	for _, s := range settles {
		// A settle that ended before the last admitted reservation began
		// had been counted when that reservation was decided.
		if !s.settled.Before(lastAdmitted) {
			inFlight += s.overage
		}
	}
	t.Logf("used %d against a limit of %d; overage in flight at the last admission %d", used, p.Limit.Limit, inFlight)
	if used <= p.Limit.Limit {
		t.Fatalf("used %d: the test must overspend the limit %d to check the bound", used, p.Limit.Limit)
	}
	if used > p.Limit.Limit+inFlight {
		t.Fatalf("used %d, over the limit %d plus the overage in flight %d", used, p.Limit.Limit, inFlight)
	}
}

// Reservations and plain checks of one hot key through three leasing
// nodes: the nodes answer most checks from their leases while refunds and
// charges land on the same key at the store. Once the nodes have given
// their unspent lease units back, Redis counts exactly the checks admitted
// plus the reservations' actuals.
func TestReservationsBesideLeasesStayExact(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "mixed", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1_000_000, Period: algorithms.MaxPeriod}}
	cfg := node.Config{Policies: []node.Policy{p}, Cluster: quotadtest.SizedCluster(3)}
	ns := make([]*node.Node, 3)
	for i := range ns {
		var err error
		if ns[i], err = node.New(cfg, newRedisStore(t, r), nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var want, leaseHits, refunds, charges atomic.Int64
	var wg sync.WaitGroup
	var failure atomic.Value
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for range 400 {
				n := ns[rng.IntN(3)]
				if w%2 == 0 {
					res, err := n.Check(ctx, p, "hot", 1)
					if err != nil || !res.Allowed {
						failure.Store(fmt.Sprintf("check: %+v %v", res, err))
						return
					}
					want.Add(1)
					if res.Source == node.SourceLease {
						leaseHits.Add(1)
					}
					continue
				}
				estimate := 1 + rng.Int64N(20)
				res, rv, err := n.Reserve(ctx, p, "hot", estimate, time.Minute)
				if err != nil || !res.Allowed {
					failure.Store(fmt.Sprintf("reserve: %+v %v", res, err))
					return
				}
				actual := rng.Int64N(2 * estimate)
				s, err := ns[rng.IntN(3)].Settle(ctx, p, "hot", rv.ID, actual)
				if err != nil || s.Outcome != algorithms.Settled {
					failure.Store(fmt.Sprintf("settle: %+v %v", s, err))
					return
				}
				refunds.Add(s.Refunded)
				charges.Add(s.Charged)
				want.Add(actual)
			}
		}()
	}
	wg.Wait()
	if f := failure.Load(); f != nil {
		t.Fatal(f)
	}
	for _, n := range ns {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	got := storedCount(t, r, p.Name, "hot")
	t.Logf("Redis counts %d, want %d (%d lease hits, %d units refunded, %d charged)", got, want.Load(), leaseHits.Load(), refunds.Load(), charges.Load())
	if leaseHits.Load() == 0 || refunds.Load() == 0 || charges.Load() == 0 {
		t.Fatal("the test must see lease hits, refunds and charges")
	}
	if got != want.Load() {
		t.Fatalf("Redis counts %d units; want the checks admitted plus the actuals, %d", got, want.Load())
	}
}
