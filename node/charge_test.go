package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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

// A charge is for rate limits (a concurrency limit takes a slot only while
// one is free, so nothing can be owed; the error says to check without
// charging) and one item at a time.
func TestChargesAreRefusedWhereTheyHaveNoMeaning(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{})
	ctx := context.Background()
	slots := node.Policy{Name: "slots", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 2, Period: time.Minute}}
	_, err := n.CheckWith(ctx, slots, "k", 1, node.CheckOptions{Charge: true})
	if !errors.Is(err, algorithms.ErrCannotCharge) || !node.IsInvalidInput(err) || !strings.Contains(err.Error(), "without charging") {
		t.Errorf("a concurrency charge: %v, want ErrCannotCharge, an input error saying to check without charging", err)
	}
	fw := node.Policy{Name: "fw", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Hour}}
	if _, err := n.CheckAllWith(ctx, []node.Item{{Policy: fw, Key: "k", Cost: 1}}, node.CheckOptions{Charge: true}); !errors.Is(err, node.ErrInvalidInput) {
		t.Errorf("an all-or-nothing charge: %v, want invalid input", err)
	}
	if _, err := n.CheckWith(ctx, fw, "k", fw.Limit.MaxCharge()+1, node.CheckOptions{Charge: true}); !errors.Is(err, algorithms.ErrInvalidCost) {
		t.Errorf("a charge over MaxCharge: %v, want ErrInvalidCost", err)
	}
	if res, err := n.Check(ctx, fw, "k", 10); err != nil || !res.Allowed {
		t.Errorf("the refused charges spent: a check of the whole limit after them: %+v, %v", res, err)
	}
}

var charging = node.CheckOptions{Charge: true}

// TestChargesOfEveryAlgorithmRecordADebt checks envoyproxy/ratelimit's
// sequence under every rate algorithm, on both stores: with a limit of 10,
// a charge of 27 is denied and counted, so that a check of 3 after it is
// denied too, and waits for the debt (token bucket: 20 s for 3 tokens when
// 17 are owed), where without charging the 27 is refused as input and the
// 3 fits.
func TestChargesOfEveryAlgorithmRecordADebt(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	// Windows of a year, so that none turns during the test; the buckets
	// and GCRA refill one unit a second.
	var limits []algorithms.Limit
	var bucket algorithms.Limit
	for _, a := range algorithms.Algorithms() {
		l := algorithms.Limit{Algorithm: a, Limit: 10, Period: algorithms.MaxPeriod}
		if a == algorithms.TokenBucket || a == algorithms.LeakyBucket || a == algorithms.GCRA {
			l.Period = 10 * time.Second
		}
		if a == algorithms.TokenBucket {
			bucket = l
		}
		limits = append(limits, l)
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := newNode(t, mk(), node.Config{})
			for _, l := range limits {
				p := node.Policy{Name: "charge", Limit: l}
				key := "charged-" + l.Algorithm.String()
				res, err := n.CheckWith(ctx, p, key, 27, charging)
				if err != nil || res.Allowed || res.Remaining != 0 || res.Source != node.SourceStore {
					t.Fatalf("%s: a charge of 27 against 10: %+v, %v; want denied by the store, 0 remaining", l.Algorithm, res, err)
				}
				res, err = n.Check(ctx, p, key, 3)
				if err != nil || res.Allowed || res.Remaining != 0 {
					t.Fatalf("%s: a check of 3 after a charge of 27: %+v, %v; want denied", l.Algorithm, res, err)
				}
				if l == bucket && (res.RetryAfter < 19*time.Second || res.RetryAfter > 20*time.Second) {
					t.Fatalf("token bucket: a check of 3 owing 17 tokens waits %s; want about 20s", res.RetryAfter)
				}

				// Without charging, a cost above the capacity is refused as
				// input, and the key stays as it was.
				other := "plain-" + l.Algorithm.String()
				if _, err := n.Check(ctx, p, other, 27); !errors.Is(err, algorithms.ErrInvalidCost) {
					t.Fatalf("%s: a plain check of 27 against 10: %v, want ErrInvalidCost", l.Algorithm, err)
				}
				if res, err := n.Check(ctx, p, other, 3); err != nil || !res.Allowed || res.Remaining != 7 {
					t.Fatalf("%s: a plain check of 3 on an untouched key: %+v, %v; want allowed, 7 remaining", l.Algorithm, res, err)
				}
			}
		})
	}
}

// storedCount reads a configured fixed-window policy's count for key at
// the authority: the newest window's, under quotad's default key prefix.
func storedCount(t *testing.T, r *redistest.Server, policy, key string) int64 {
	t.Helper()
	n, err := r.FixedWindowCount("{quotad:" + policy + ":" + key + "}:fw4")
	if err != nil {
		t.Fatalf("the count of %s/%s: %v", policy, key, err)
	}
	return n
}

// bucketUsed reads the token bucket state of policy and key at Redis and
// returns the units it has counted: its capacity less its tokens (a debt
// below empty included).
func bucketUsed(t *testing.T, r *redistest.Server, policy, key string, capacity int64) int64 {
	t.Helper()
	v, err := r.Do("GET", "{quotad:"+policy+":"+key+"}:tb3")
	if err != nil {
		t.Fatalf("GET the state of %s/%s: %v", policy, key, err)
	}
	f := strings.Fields(v)
	if len(f) == 4 && strings.HasPrefix(f[0], "r") {
		f = f[1:] // a fresh write's form: "r<ttl>", then "tokens r ts"
	}
	if len(f) != 3 {
		t.Fatalf("the state of %s/%s is %q, want \"tokens r ts\"", policy, key, v)
	}
	tokens, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return capacity - tokens
}

// TestChargeIsNotAnsweredByARememberedDenial checks that a denial
// the node remembers does not hide a charge that matters: once a token
// bucket's denial answers plain checks locally, a charge still goes to
// Redis, where it deepens the debt, and plain checks are still answered
// locally after it. A fixed window's denial with nothing remaining is
// spent until its end, when its count starts over: a charge could only add
// to a count no later check reads, so that denial answers it without Redis.
func TestChargeIsNotAnsweredByARememberedDenial(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	for _, a := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			p := node.Policy{Name: "remembered-" + a.String(), Limit: algorithms.Limit{Algorithm: a, Limit: 5, Period: algorithms.MaxPeriod}, Lease: node.LeaseOff}
			store := &countingStore{Store: newRedisStore(t, r)}
			n := newNode(t, store, node.Config{Policies: []node.Policy{p}})
			for i := range 6 {
				if res, err := n.Check(ctx, p, "k", 1); err != nil || res.Allowed != (i < 5) {
					t.Fatalf("check %d of 5/year: %+v, %v", i, res, err)
				}
			}
			// The denial reaches the cache asynchronously.
			var denial node.Result
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err := n.Check(ctx, p, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Source == node.SourceDeniedCache {
					denial = res
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the denial was never remembered: %+v", res)
				}
				time.Sleep(time.Millisecond)
			}
			before := store.Acquires.Load()
			var last node.Result
			for i := range 3 {
				res, err := n.CheckWith(ctx, p, "k", 1, charging)
				if err != nil || res.Allowed {
					t.Fatalf("charge %d on a remembered denial: %+v, %v; want denied", i, res, err)
				}
				last = res
			}
			calls := store.Acquires.Load() - before
			if a == algorithms.FixedWindow {
				if calls != 0 || last.Source != node.SourceDeniedCache {
					t.Fatalf("3 charges of a spent window made %d store calls (last %+v); want all answered by the remembered denial", calls, last)
				}
				if got := storedCount(t, r, p.Name, "k"); got != 5 {
					t.Fatalf("Redis counts %d for the key, want the 5 admitted", got)
				}
				return
			}
			if calls != 3 || last.Source != node.SourceStore {
				t.Fatalf("3 charges made %d store calls (last %+v), want 3, each denied by the store", calls, last)
			}
			// Each charge of 1 adds a token's refill to the wait.
			if last.RetryAfter <= denial.RetryAfter {
				t.Fatalf("the wait after 3 charges is %s, not beyond the %s before them: the debt was not recorded", last.RetryAfter, denial.RetryAfter)
			}
			if res, err := n.Check(ctx, p, "k", 1); err != nil || res.Source != node.SourceDeniedCache {
				t.Fatalf("a plain check after the charges: %+v, %v; want still answered by the remembered denial", res, err)
			}
		})
	}
}

// TestChargesOnLeasingNodesAdmitAtMostTheLimit drives three nodes
// with leases on one Redis with charges of random costs until far
// more than the limit has been asked, and checks the two sides of the
// rule: the cluster admits at most the limit in total (lease hits
// included: a lease's units were counted when taken), and once the nodes
// have given their unspent lease units back, Redis counts every unit
// asked, admitted or not, exactly: a token bucket's debt, which a year's
// refill does not touch during the test.
func TestChargesOnLeasingNodesAdmitAtMostTheLimit(t *testing.T) {
	r := redistest.Start(t)
	const limit, nodes, workers, checks = 3000, 3, 4, 600
	// Refilled over a year: not a whole token during the test.
	p := node.Policy{Name: "leased", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: limit, Period: algorithms.MaxPeriod}}
	cfg := node.Config{Policies: []node.Policy{p}, Cluster: quotadtest.SizedCluster(nodes), Lease: node.LeaseConfig{MaxFraction: 0.3}}
	ns := make([]*node.Node, nodes)
	for i := range ns {
		var err error
		if ns[i], err = node.New(cfg, newRedisStore(t, r), nil); err != nil {
			t.Fatal(err)
		}
	}
	var admitted, asked, leaseHits atomic.Int64
	var wg sync.WaitGroup
	var failure atomic.Value
	for i, n := range ns {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				for range checks {
					cost := 1 + rng.Int64N(3)
					res, err := n.CheckWith(context.Background(), p, "hot", cost, charging)
					if err != nil || res.Source == node.SourceFailOpen || res.Source == node.SourceFailClosed {
						failure.Store(fmt.Sprintf("%+v, %v", res, err))
						return
					}
					asked.Add(cost)
					if res.Allowed {
						admitted.Add(cost)
					}
					if res.Source == node.SourceLease {
						leaseHits.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if f := failure.Load(); f != nil {
		t.Fatalf("a check failed: %s", f)
	}
	for _, n := range ns {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("asked %d units, admitted %d (limit %d), %d lease hits", asked.Load(), admitted.Load(), limit, leaseHits.Load())
	if leaseHits.Load() == 0 {
		t.Fatal("no check spent a lease: the test does not exercise leases")
	}
	if asked.Load() < 2*limit {
		t.Fatalf("only %d units asked; the test must ask well over the limit %d", asked.Load(), limit)
	}
	if admitted.Load() > limit {
		t.Fatalf("the cluster admitted %d units, over the limit %d", admitted.Load(), limit)
	}
	if got := bucketUsed(t, r, p.Name, "hot", limit); got != asked.Load() {
		t.Fatalf("Redis counts %d units, want every unit asked: %d", got, asked.Load())
	}
}
