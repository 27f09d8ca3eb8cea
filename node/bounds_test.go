package node_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// manualClock is a clock tests move by hand.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// A full memory store refuses checks that would add a key, with
// ErrStoreFull rather than a failure-mode answer; keys it holds are still
// decided, looks (cost 0) at new keys are answered, and keys that expire
// or are reset make room again.
func TestMemoryStoreKeyCap(t *testing.T) {
	clock := &manualClock{now: time.UnixMilli(1_700_000_000_000)}
	store, err := memory.Open(memory.Config{MaxKeys: 3, SweepEvery: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	// Fail-open would admit everything once full: the refusal must win.
	n := newNode(t, store, node.Config{DefaultFailureMode: node.FailOpen})
	ctx := context.Background()
	p := node.Policy{Name: "p", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}}
	for _, k := range []string{"a", "b", "c"} {
		if res, err := n.Check(ctx, p, k, 1); err != nil || !res.Allowed {
			t.Fatalf("%s: %+v, %v", k, res, err)
		}
	}
	res, err := n.Check(ctx, p, "d", 1)
	if !errors.Is(err, node.ErrStoreFull) || !strings.Contains(err.Error(), "it holds 3 keys") {
		t.Fatalf("a fourth key: %+v, %v; want ErrStoreFull", res, err)
	}
	if res, err := n.Check(ctx, p, "d", 0); err != nil || !res.Allowed {
		t.Fatalf("a look at a fourth key: %+v, %v", res, err)
	}
	if res, err := n.Check(ctx, p, "a", 1); err != nil || !res.Allowed || res.Remaining != 3 {
		t.Fatalf("a held key at the cap: %+v, %v", res, err)
	}
	if store.Len() != 3 || store.Refused() != 1 {
		t.Fatalf("Len %d, Refused %d; want 3 and 1", store.Len(), store.Refused())
	}

	if err := n.Reset(ctx, "p", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Check(ctx, p, "d", 1); err != nil {
		t.Fatalf("after a reset made room: %v", err)
	}

	// Once the windows end, the refusal itself asks for a sweep (at most
	// one a second), which makes room.
	clock.Add(time.Minute)
	waitUntil(t, 10*time.Second, "an early sweep to make room", func() bool {
		_, err := n.Check(ctx, p, "e", 1)
		return err == nil
	})
}

func TestMemoryConfigValidate(t *testing.T) {
	if _, err := memory.Open(memory.Config{MaxKeys: -1}); !errors.Is(err, node.ErrInvalidConfig) {
		t.Fatalf("MaxKeys -1: %v", err)
	}
}

// The lease table holds at most LeaseConfig.MaxKeys keys, however long the
// hold: keys beyond it are decided by the store one check at a time, and
// idle keys are forgotten after a few horizons, not after the hold.
func TestLeaseTableIsBounded(t *testing.T) {
	n := newNode(t, remoteMemory{memory.New(nil, 0)}, node.Config{
		Lease: node.LeaseConfig{Horizon: 50 * time.Millisecond, Hold: time.Hour, MaxKeys: 10},
	})
	ctx := context.Background()
	p := node.Policy{Name: "p", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Minute}}
	for i := range 100 {
		res, err := n.Check(ctx, p, string(rune('a'+i%26))+strings.Repeat("x", i), 1)
		if err != nil || !res.Allowed || res.Source != node.SourceStore {
			t.Fatalf("key %d: %+v, %v", i, res, err)
		}
	}
	if st := n.Stats(); st.LeaseKeys != 10 || st.LeaseTableFull != 90 {
		t.Fatalf("LeaseKeys %d, LeaseTableFull %d; want 10 and 90", st.LeaseKeys, st.LeaseTableFull)
	}
	// Forgotten after max(1s, 4 × horizon) idle, not 4 × the 1h hold.
	waitUntil(t, 10*time.Second, "idle keys to be forgotten", func() bool { return n.Stats().LeaseKeys == 0 })
}

func TestLeaseHoldIsBounded(t *testing.T) {
	err := node.Config{Lease: node.LeaseConfig{Hold: 2 * time.Hour}}.Validate()
	if !errors.Is(err, node.ErrInvalidConfig) || !strings.Contains(err.Error(), "lease hold: invalid config: 2h0m0s exceeds 1h0m0s") {
		t.Fatalf("a 2h hold: %v", err)
	}
	if err := (node.Config{Lease: node.LeaseConfig{Hold: time.Hour}}).Validate(); err != nil {
		t.Fatalf("a 1h hold: %v", err)
	}
}
