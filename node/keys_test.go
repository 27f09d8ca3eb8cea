package node_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// spend checks key under p until the store denies it, and returns how many
// units were allowed; more than max is a failure.
func spend(t *testing.T, n *node.Node, p node.Policy, key string, max int) int {
	t.Helper()
	for allowed := 0; ; allowed++ {
		res, err := n.Check(context.Background(), p, key, 1)
		if err != nil {
			t.Fatalf("%s %s: %v", p.Name, key, err)
		}
		if !res.Allowed {
			return allowed
		}
		if allowed >= max {
			t.Fatalf("%s %s: more than %d allowed", p.Name, key, max)
		}
	}
}

// Prefix q with inline namespace prod and key
// per-ip:victim2 was the same Redis key as prefix q:prod's configured policy
// per-ip and key victim2, and one inline check with a 1 ms period
// re-windowed the victim (6 admitted under 3/min). On one real redis-server
// the two deployments now have keys of their own.
func TestTwoDeploymentsOnOneRedisDoNotCollide(t *testing.T) {
	r := redistest.Start(t)
	perIP := node.Policy{Name: "per-ip", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 3, Period: time.Minute}, Lease: node.LeaseOff}
	victimCfg := node.Config{KeyPrefix: "q:prod", Policies: []node.Policy{perIP}}
	victim := newNode(t, newRedisStore(t, r), victimCfg)
	other := newNode(t, newRedisStore(t, r), node.Config{KeyPrefix: "q"})

	if got := spend(t, victim, perIP, "victim2", 3); got != 3 {
		t.Fatalf("the victim got %d of 3", got)
	}
	hostile := node.Policy{Name: "prod", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Millisecond}}
	for i := range 5 {
		if res, err := other.Check(context.Background(), hostile, "per-ip:victim2", 1); err != nil || !res.Allowed {
			t.Fatalf("the other deployment's check %d: %+v, %v", i, res, err)
		}
	}
	// A fresh node of the victim's deployment, so that only Redis answers.
	fresh := newNode(t, newRedisStore(t, r), victimCfg)
	res, err := fresh.Check(context.Background(), perIP, "victim2", 1)
	if err != nil || res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("the victim's 4th check after the other deployment's: %+v, %v; want denied by the store", res, err)
	}
	keys, err := r.DoList("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	// The other deployment's state expired within its 1 ms; the victim's
	// is where its (escaped) prefix puts it.
	if want := "{q%3Aprod:per-ip:victim2}:fw4:"; !containsPrefix(keys, want) {
		t.Errorf("no key %s among %q", want, keys)
	}
}

// containsPrefix reports whether an item of list starts with prefix.
func containsPrefix(list []string, prefix string) bool {
	for _, x := range list {
		if strings.HasPrefix(x, prefix) {
			return true
		}
	}
	return false
}

// Any client could send another period for an inline
// key and restart its window. Now an inline limit's state is bound to the
// limit: for every algorithm, on a real redis-server and on the memory
// store, another limit on the same namespace and key has state of its own
// and the victim stays denied. Reset of the namespace's key forgets every
// inline limit it was checked with.
func TestInlineLimitsDoNotRewindowEachOther(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"redis":  func() node.Store { return newRedisStore(t, r) },
		"memory": func() node.Store { return memory.New(nil, 0) },
	}
	for storeName, newStore := range stores {
		for _, alg := range algorithms.Algorithms() {
			t.Run(storeName+"/"+alg.String(), func(t *testing.T) {
				ctx := context.Background()
				store := newStore()
				n := newNode(t, store, node.Config{})
				victim := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: alg, Limit: 3, Period: time.Hour}, Lease: node.LeaseOff}
				hostile := victim
				hostile.Limit.Limit, hostile.Limit.Period = 1000, time.Millisecond
				key := "victim-" + alg.String()

				if got := spend(t, n, victim, key, 3); got != 3 {
					t.Fatalf("the victim got %d of 3", got)
				}
				for i := range 3 {
					if res, err := n.Check(ctx, hostile, key, 1); err != nil || !res.Allowed {
						t.Fatalf("hostile check %d: %+v, %v", i, res, err)
					}
				}
				if storeName == "redis" {
					// A fresh node, so that only Redis answers.
					n = newNode(t, newRedisStore(t, r), node.Config{})
				}
				if res, err := n.Check(ctx, victim, key, 1); err != nil || res.Allowed {
					t.Fatalf("the victim after another period's checks: %+v, %v; want denied", res, err)
				}
				// Both limits hold state; Reset forgets both.
				if res, _ := n.Check(ctx, hostile, key, 1); !res.Allowed {
					t.Fatalf("the 1 ms limit: %+v", res)
				}
				if err := n.Reset(ctx, "api", key); err != nil {
					t.Fatal(err)
				}
				if got := spend(t, n, victim, key, 3); got != 3 {
					t.Fatalf("after Reset the victim got %d of 3", got)
				}
				if storeName == "redis" {
					keys, err := r.DoList("KEYS", "*"+key+"*")
					if err != nil {
						t.Fatal(err)
					}
					// Only the victim's fresh state remains.
					for _, k := range keys {
						if !strings.Contains(k, "}/3/3600000/3:") {
							t.Errorf("left after Reset: %s (all: %q)", k, keys)
						}
					}
				}
			})
		}
	}
}

// A Reset of a configured policy's key still resets it, and one of a key
// that was never checked is fine.
func TestResetOfConfiguredAndUnknownKeys(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 2, Period: time.Hour}, Lease: node.LeaseOff}
	n := newNode(t, newRedisStore(t, r), node.Config{Policies: []node.Policy{p}})
	if got := spend(t, n, p, "k}1", 2); got != 2 {
		t.Fatalf("got %d of 2", got)
	}
	if got, err := r.Do("EXISTS", "{quotad:api:k%7D1}:tb3"); err != nil || got != "1" {
		t.Fatalf("EXISTS {quotad:api:k%%7D1}:tb3 = %q, %v", got, err)
	}
	for _, key := range []string{"k}1", "never-seen"} {
		if err := n.Reset(context.Background(), "api", key); err != nil {
			t.Fatalf("Reset %s: %v", key, err)
		}
	}
	if got := spend(t, n, p, "k}1", 2); got != 2 {
		t.Fatalf("after Reset got %d of 2", got)
	}
}

// Reset of an inline namespace's key finds its limits with SCAN: a key full
// of glob characters resets exactly its own limits, not those of keys its
// unescaped pattern would match, among a few thousand other keys.
func TestResetInlineMatchesOnlyItsKey(t *testing.T) {
	r := redistest.Start(t)
	n := newNode(t, newRedisStore(t, r), node.Config{})
	ctx := context.Background()
	limits := []algorithms.Limit{
		{Algorithm: algorithms.TokenBucket, Limit: 2, Period: time.Hour},
		{Algorithm: algorithms.SlidingWindowLog, Limit: 2, Period: time.Minute},
	}
	const key, lookalike = `a*b?[x]\}`, `a*bc?[x]\}`
	for _, k := range []string{key, lookalike} {
		for _, l := range limits {
			if got := spend(t, n, node.Policy{Name: "ns", Limit: l, Lease: node.LeaseOff}, k, 2); got != 2 {
				t.Fatalf("%s: %d of 2", k, got)
			}
		}
	}
	for i := range 1500 {
		if _, err := r.Do("SET", "filler:"+strconv.Itoa(i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Reset(ctx, "ns", key); err != nil {
		t.Fatal(err)
	}
	for _, l := range limits {
		p := node.Policy{Name: "ns", Limit: l, Lease: node.LeaseOff}
		if res, _ := n.Check(ctx, p, key, 1); !res.Allowed {
			t.Errorf("%s after Reset: %+v; want a fresh state", l.Algorithm, res)
		}
		if res, _ := n.Check(ctx, p, lookalike, 1); res.Allowed {
			t.Errorf("%s: the look-alike key was reset too: %+v", l.Algorithm, res)
		}
	}
}
