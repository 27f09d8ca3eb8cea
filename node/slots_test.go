package node_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

var twoSlots = algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 2, Period: time.Minute}

// Both stores: a check takes a slot and names it; a full limit denies; a
// release frees the slot at once and only once; renew and release of a
// slot that is not held, of a bad id or under a rate policy are errors;
// Reset frees every slot.
func TestSlots(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := newNode(t, mk(), node.Config{})
			p := node.Policy{Name: "gpu", Limit: twoSlots}
			a, err := n.Check(ctx, p, "tenant", 1)
			if err != nil || !a.Allowed || a.Slot == "" || a.Remaining != 1 || a.Source != node.SourceStore {
				t.Fatalf("first check: %+v, %v", a, err)
			}
			b, _ := n.Check(ctx, p, "tenant", 1)
			if !b.Allowed || b.Slot == "" || b.Slot == a.Slot || b.Remaining != 0 {
				t.Fatalf("second check: %+v (first slot %q)", b, a.Slot)
			}
			if c, _ := n.Check(ctx, p, "tenant", 1); c.Allowed || c.Slot != "" || c.RetryAfter <= 0 || c.RetryAfter > time.Minute {
				t.Fatalf("third check, on a full limit: %+v", c)
			}
			if c, _ := n.Check(ctx, p, "tenant", 0); c.Allowed || c.Slot != "" || c.Remaining != 0 {
				t.Fatalf("cost 0 on a full limit: %+v", c)
			}
			if res, err := n.RenewSlot(ctx, p, "tenant", a.Slot); err != nil || !res.Allowed || res.Remaining != 0 {
				t.Fatalf("renew: %+v, %v", res, err)
			}
			if res, err := n.ReleaseSlot(ctx, p, "tenant", a.Slot); err != nil || res.Remaining != 1 {
				t.Fatalf("release: %+v, %v", res, err)
			}
			if _, err := n.ReleaseSlot(ctx, p, "tenant", a.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
				t.Fatalf("second release: %v, want ErrSlotNotHeld", err)
			}
			if _, err := n.RenewSlot(ctx, p, "tenant", a.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
				t.Fatalf("renew after release: %v, want ErrSlotNotHeld", err)
			}
			// The released slot is free at once: no cached denial stands in
			// the way.
			c, _ := n.Check(ctx, p, "tenant", 1)
			if !c.Allowed || c.Slot == "" {
				t.Fatalf("check after the release: %+v", c)
			}
			if _, err := n.ReleaseSlot(ctx, p, "tenant", "never-taken"); !errors.Is(err, node.ErrSlotNotHeld) {
				t.Fatalf("release of an unknown id: %v", err)
			}
			if _, err := n.ReleaseSlot(ctx, p, "other-key", b.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
				t.Fatalf("release under another key: %v", err)
			}
			for name, err := range map[string]error{
				"empty id": func() error { _, err := n.ReleaseSlot(ctx, p, "tenant", ""); return err }(),
				"long id":  func() error { _, err := n.RenewSlot(ctx, p, "tenant", string(make([]byte, 65))); return err }(),
				"rate policy": func() error {
					_, err := n.ReleaseSlot(ctx, node.Policy{Name: "demo", Limit: fiveAMinute}, "tenant", b.Slot)
					return err
				}(),
				"empty key": func() error { _, err := n.RenewSlot(ctx, p, "", b.Slot); return err }(),
			} {
				if !node.IsInvalidInput(err) {
					t.Errorf("%s: %v, want invalid input", name, err)
				}
			}
			if _, err := n.Check(ctx, p, "tenant", 2); !errors.Is(err, algorithms.ErrInvalidCost) {
				t.Errorf("cost 2: %v, want ErrInvalidCost", err)
			}
			if err := n.Reset(ctx, "gpu", "tenant"); err != nil {
				t.Fatal(err)
			}
			if _, err := n.ReleaseSlot(ctx, p, "tenant", b.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
				t.Fatalf("release after Reset: %v", err)
			}
			if res, _ := n.Check(ctx, p, "tenant", 0); !res.Allowed || res.Remaining != 2 {
				t.Fatalf("after Reset: %+v", res)
			}
		})
	}
}

// A slot lives a period from its last renew, then is free again whether or
// not its holder is alive; a renew or release then is too late. (The
// memory store on a clock the test moves.)
func TestSlotsExpireUnlessRenewed(t *testing.T) {
	var mu sync.Mutex
	now := time.UnixMilli(1_700_000_000_000)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	n := newNode(t, memory.New(clock, 0), node.Config{})
	ctx := context.Background()
	p := node.Policy{Name: "job", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Second}}
	a, _ := n.Check(ctx, p, "k", 1)
	if !a.Allowed {
		t.Fatalf("first check: %+v", a)
	}
	advance(600 * time.Millisecond)
	if _, err := n.RenewSlot(ctx, p, "k", a.Slot); err != nil {
		t.Fatal(err)
	}
	advance(600 * time.Millisecond) // 1.2 s: alive thanks to the renew
	if res, _ := n.Check(ctx, p, "k", 1); res.Allowed || res.RetryAfter != 400*time.Millisecond {
		t.Fatalf("at 1.2 s: %+v, want denied until the renewed slot expires at 1.6 s", res)
	}
	advance(400 * time.Millisecond) // 1.6 s: the holder stopped renewing
	b, _ := n.Check(ctx, p, "k", 1)
	if !b.Allowed {
		t.Fatalf("at 1.6 s: %+v, want the expired slot free", b)
	}
	if _, err := n.RenewSlot(ctx, p, "k", a.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
		t.Fatalf("renew of the expired slot: %v", err)
	}
	if _, err := n.ReleaseSlot(ctx, p, "k", a.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
		t.Fatalf("release of the expired slot: %v", err)
	}
	if _, err := n.ReleaseSlot(ctx, p, "k", b.Slot); err != nil {
		t.Fatalf("the new holder's release: %v", err)
	}
}

// On Redis, concurrency checks never lease and never answer from the
// denied cache: a slot another node frees is granted on the next check,
// however many denials came before.
func TestSlotsBypassLeasesAndDeniedCache(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	n1 := newNode(t, newRedisStore(t, r), node.Config{})
	n2 := newNode(t, newRedisStore(t, r), node.Config{})
	p := node.Policy{Name: "one", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Minute}}
	held, _ := n2.Check(ctx, p, "k", 1)
	if !held.Allowed {
		t.Fatalf("n2: %+v", held)
	}
	for i := range 200 {
		if res, _ := n1.Check(ctx, p, "k", 1); res.Allowed || res.Source != node.SourceStore {
			t.Fatalf("n1 check %d while n2 holds the slot: %+v", i, res)
		}
	}
	if _, err := n2.ReleaseSlot(ctx, p, "k", held.Slot); err != nil {
		t.Fatal(err)
	}
	if res, _ := n1.Check(ctx, p, "k", 1); !res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("n1 after n2's release: %+v", res)
	}
	st := n1.Stats()
	if st.LeasesGranted != 0 || st.DenialsCached != 0 || st.DeniedCacheHits != 0 || st.LeaseHits != 0 {
		t.Fatalf("n1 leased or cached: %+v", st)
	}
	if st.StoreCalls != 201 {
		t.Errorf("n1 made %d store calls for 201 checks", st.StoreCalls)
	}
}

// A concurrency check takes its policy's failure mode when Redis is down:
// open admits without a slot, closed denies; renew and release fail with
// ErrStore.
func TestSlotsWhenTheStoreFails(t *testing.T) {
	r := redistest.Start(t)
	n := newNode(t, newRedisStore(t, r), node.Config{})
	ctx := context.Background()
	open := node.Policy{Name: "open", Limit: twoSlots, OnStoreError: node.FailOpen}
	closed := node.Policy{Name: "closed", Limit: twoSlots, OnStoreError: node.FailClosed}
	a, _ := n.Check(ctx, open, "k", 1)
	r.Kill()
	if res, err := n.Check(ctx, open, "k", 1); err != nil || !res.Allowed || res.Slot != "" || res.Source != node.SourceFailOpen {
		t.Errorf("open: %+v, %v", res, err)
	}
	if res, err := n.Check(ctx, closed, "k", 1); err != nil || res.Allowed || res.Source != node.SourceFailClosed {
		t.Errorf("closed: %+v, %v", res, err)
	}
	if _, err := n.ReleaseSlot(ctx, open, "k", a.Slot); !errors.Is(err, node.ErrStore) {
		t.Errorf("release while Redis is down: %v, want ErrStore", err)
	}
}

// On a 3-master Redis Cluster, keys in different hash slots each hold
// their own slots: the script's one key lives under the limit's hash tag,
// on the master that owns it, with a TTL.
func TestSlotsOnRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	// Configured, so that its keys are the plain {quotad:gpu:<key>} (an
	// inline limit's would carry its variant).
	p := node.Policy{Name: "gpu", Limit: twoSlots}
	n := newNode(t, newClusterStore(t, c), node.Config{Policies: []node.Policy{p}})
	ctx := context.Background()
	masters := map[int]bool{}
	for i := range 12 {
		key := "tenant-" + string(rune('a'+i))
		a, _ := n.Check(ctx, p, key, 1)
		b, _ := n.Check(ctx, p, key, 1)
		if c, _ := n.Check(ctx, p, key, 1); !a.Allowed || !b.Allowed || c.Allowed {
			t.Fatalf("%s: %+v, %+v, then %+v; want two slots, then a denial", key, a, b, c)
		}
		if _, err := n.ReleaseSlot(ctx, p, key, a.Slot); err != nil {
			t.Fatalf("%s: release: %v", key, err)
		}
		if _, err := n.ReleaseSlot(ctx, p, key, a.Slot); !errors.Is(err, node.ErrSlotNotHeld) {
			t.Fatalf("%s: second release: %v", key, err)
		}
		if _, err := n.RenewSlot(ctx, p, key, b.Slot); err != nil {
			t.Fatalf("%s: renew: %v", key, err)
		}
		redisKey := algorithms.Keys(algorithms.Concurrency, keyBase("gpu", key))[0]
		owner := c.Owner(c.Slot(redisKey))
		masters[owner] = true
		if ttl, err := c.Master(owner).Do("PTTL", redisKey); err != nil || ttl == "-1" || ttl == "-2" {
			t.Fatalf("%s: PTTL %s on its master: %q, %v", key, redisKey, ttl, err)
		}
	}
	if len(masters) < 2 {
		t.Errorf("the keys landed on %d master(s); the test wants several", len(masters))
	}
}
