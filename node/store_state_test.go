package node_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

var (
	// leasedPolicy leases big: its key "hot" holds thousands of units.
	leasedPolicy = node.Policy{Name: "leased", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000_000, Period: time.Hour}}
	// smallPolicy is 3 an hour, never leased: its key "abuser" gets denied.
	smallPolicy = node.Policy{Name: "small", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 3, Period: time.Hour}, Lease: node.LeaseOff}
)

// stateNode returns a node on r that checks Redis's state every 20 ms, with
// a lease of thousands of units on leased/hot and a cached denial of
// small/abuser, once it has seen Redis's state at least twice.
func stateNode(t *testing.T, r *redistest.Server) *node.Node {
	t.Helper()
	n := newNode(t, newRedisStore(t, r), node.Config{
		Policies:        []node.Policy{leasedPolicy, smallPolicy},
		Lease:           node.LeaseConfig{Horizon: time.Second, Hold: time.Hour},
		StoreStateCheck: 20 * time.Millisecond,
	})
	ctx := context.Background()
	for i := 0; n.Stats().UnitsHeld < 1000; i++ {
		if i > 1_000_000 {
			t.Fatal("no lease after 1M checks")
		}
		if _, err := n.Check(ctx, leasedPolicy, "hot", 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := spend(t, n, smallPolicy, "abuser", 3); got != 3 {
		t.Fatalf("abuser: %d of 3", got)
	}
	if res, _ := n.Check(ctx, smallPolicy, "abuser", 1); res.Allowed || res.Source != node.SourceDeniedCache {
		t.Fatalf("abuser after the denial: %+v; want the cached denial", res)
	}
	// The watch renews the marker's TTL on every check: once it has been
	// renewed, a check that recorded the state has finished.
	pttl := func() int64 {
		v, err := r.Do("PTTL", "{quotad}:state")
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := strconv.ParseInt(v, 10, 64)
		return ms
	}
	waitUntil(t, 10*time.Second, "the state marker", func() bool { return pttl() > 0 })
	// A renewal shows as the TTL going up. Compare with the lowest reading
	// so far, not the first: read within a millisecond of a renewal, the
	// first is already the full TTL, which no later reading exceeds.
	lowest := pttl()
	waitUntil(t, 10*time.Second, "the state marker's renewal", func() bool {
		ms := pttl()
		if ms > lowest {
			return true
		}
		lowest = ms
		return false
	})
	if s := n.Stats(); s.StoreStateLosses != 0 {
		t.Fatalf("%d state losses before anything happened", s.StoreStateLosses)
	}
	return n
}

// afterLoss checks that n dropped its lease and its cached denial: no unit
// held, and the next checks of both keys are Redis's decisions.
func afterLoss(t *testing.T, n *node.Node) (abuser node.Result) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, 10*time.Second, "the node to see the store's new state", func() bool { return n.Stats().StoreStateLosses >= 1 })
	s := n.Stats()
	t.Logf("after the loss: %d units held, %d state losses", s.UnitsHeld, s.StoreStateLosses)
	if s.UnitsHeld != 0 {
		t.Errorf("%d leased units still held", s.UnitsHeld)
	}
	// Redis may take a moment to accept checks again (a restart reloads
	// scripts; the breaker may be open): retry what failed.
	var hot, res node.Result
	waitUntil(t, 10*time.Second, "a decision from Redis", func() bool {
		var err error
		hot, err = n.Check(ctx, leasedPolicy, "hot", 1)
		if err != nil {
			t.Fatal(err)
		}
		return hot.Source == node.SourceStore
	})
	res, err := n.Check(ctx, smallPolicy, "abuser", 1)
	if err != nil || res.Source != node.SourceStore {
		t.Fatalf("abuser after the loss: %+v, %v; want Redis's decision, not the old cached denial", res, err)
	}
	return res
}

// FLUSHALL empties Redis under a node holding a lease and
// a cached denial. The node sees the marker gone, drops both and asks
// Redis, which counts from zero again: the key that was denied is allowed —
// that over-admission is the data loss's, and the README says so; the node
// no longer adds its old lease's units or old denials on top.
func TestFlushallDropsLeasesAndDenials(t *testing.T) {
	r := redistest.Start(t)
	n := stateNode(t, r)
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if res := afterLoss(t, n); !res.Allowed {
		t.Fatalf("abuser after FLUSHALL: %+v; Redis forgot the count, so it admits", res)
	}
}

// redis-server without persistence is killed (SIGKILL)
// and restarted empty, a new run_id: the node drops its lease and cached
// denial.
func TestRedisRestartWithoutPersistenceDropsLeasesAndDenials(t *testing.T) {
	r := redistest.Start(t)
	n := stateNode(t, r)
	r.Kill()
	r.Restart()
	if res := afterLoss(t, n); !res.Allowed {
		t.Fatalf("abuser after the restart: %+v; Redis lost the count, so it admits", res)
	}
}

// With the append-only file (deploy/redis.conf runs appendfsync everysec;
// here every write is fsynced, so the test does not depend on timing) the
// counters survive kill -9: the node still drops what it held (the
// run_id changed, and with everysec up to a second of writes may be gone),
// and Redis, not a cached denial, denies the abuser: 3 admitted in all.
func TestRedisRestartWithAOFKeepsTheCount(t *testing.T) {
	r := redistest.Start(t, redistest.WithDurableWrites())
	n := stateNode(t, r)
	r.Kill()
	r.Restart()
	if res := afterLoss(t, n); res.Allowed {
		t.Fatalf("abuser after a restart with AOF: %+v; the count survived, so it must deny", res)
	}
}
