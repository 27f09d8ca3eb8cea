package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// gossipCluster is k nodes on one Redis, members of one cluster on fn,
// each counting its store calls; it returns once every node sees all k.
func gossipCluster(t *testing.T, r *redistest.Server, fn *faultNet, k int, cfg node.Config) ([]*node.Node, []*countingStore, []member) {
	t.Helper()
	ms := startCluster(t, fn, k, nil)
	nodes := make([]*node.Node, k)
	stores := make([]*countingStore, k)
	for i, m := range ms {
		stores[i] = &countingStore{Store: newRedisStore(t, r)}
		c := cfg
		c.Cluster = m.Membership
		nodes[i] = newNode(t, stores[i], c)
	}
	for _, m := range ms {
		waitFor(t, 20*testDeadAfter, func() (bool, string) {
			return m.Size() == k, fmt.Sprintf("%s sees %d members; want %d", m.Name(), m.Size(), k)
		})
	}
	return nodes, stores, ms
}

// waitGossip waits until cond holds for m's gossip counters.
func waitGossip(t *testing.T, m member, what string, cond func(node.GossipStats) bool) {
	t.Helper()
	waitFor(t, 20*testDeadAfter, func() (bool, string) {
		g := m.Stats().Gossip
		return cond(g), fmt.Sprintf("%s: waiting for %s; gossip %+v", m.Name(), what, g)
	})
}

// A denial one node gets from Redis reaches the others, which then answer
// the key from their denied cache without calling Redis.
func TestDenialsAreGossiped(t *testing.T) {
	r := redistest.Start(t)
	nodes, stores, ms := gossipCluster(t, r, newFaultNet(), 3, node.Config{})
	ctx := context.Background()
	p := node.Policy{Name: "g", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Hour}}
	for i := range 5 {
		if res, err := nodes[0].Check(ctx, p, "k", 1); err != nil || !res.Allowed {
			t.Fatalf("check %d on a: %+v, %v", i+1, res, err)
		}
	}
	res, err := nodes[0].Check(ctx, p, "k", 1)
	if err != nil || res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("sixth check on a: %+v, %v; want denied by the store", res, err)
	}
	if s := ms[0].Stats().Gossip; s.DenialsSent != 1 {
		t.Fatalf("a queued %d denials; want 1", s.DenialsSent)
	}
	for _, m := range ms[1:] {
		waitGossip(t, m, "the denial", func(g node.GossipStats) bool { return g.DenialsReceived >= 1 })
	}
	for i, n := range nodes[1:] {
		before := stores[i+1].Calls()
		got, err := n.Check(ctx, p, "k", 1)
		if err != nil || got.Allowed || got.Source != node.SourceDeniedCache {
			t.Fatalf("node %s: %+v, %v; want denied from the denied cache", ms[i+1].Name(), got, err)
		}
		if got.RetryAfter <= 55*time.Minute || got.RetryAfter > res.RetryAfter || got.Limit != 5 || got.Remaining != 0 {
			t.Fatalf("node %s answered %+v; the store said %+v", ms[i+1].Name(), got.Decision, res.Decision)
		}
		// Whole milliseconds, as the store and the local path answer,
		// although the gossip's age is not.
		if got.RetryAfter%time.Millisecond != 0 || got.ResetAfter%time.Millisecond != 0 {
			t.Fatalf("node %s answered waits of %s and %s; want whole milliseconds", ms[i+1].Name(), got.RetryAfter, got.ResetAfter)
		}
		if calls := stores[i+1].Calls(); calls != before {
			t.Fatalf("node %s made %d store calls for a gossiped denial", ms[i+1].Name(), calls-before)
		}
	}
	// The gossiped denial covers only that limit: another limit on the key
	// goes to the store.
	other := p
	other.Limit.Limit = 6
	before := stores[2].Calls()
	if got, _ := nodes[2].Check(ctx, other, "k", 1); got.Source != node.SourceStore || stores[2].Calls() != before+1 {
		t.Fatalf("another limit: %+v after %d store calls; want the store's answer", got, stores[2].Calls()-before)
	}
}

// Reset on one node drops the other nodes' leases and cached denials of
// the key, once each however often the message is retransmitted.
func TestResetReachesEveryNode(t *testing.T) {
	r := redistest.Start(t)
	nodes, stores, ms := gossipCluster(t, r, newFaultNet(), 3, node.Config{})
	ctx := context.Background()
	p := node.Policy{Name: "r", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100_000, Period: time.Hour}}
	// b takes a lease on the key ...
	waitFor(t, 10*time.Second, func() (bool, string) {
		if _, err := nodes[1].Check(ctx, p, "k", 1); err != nil {
			t.Fatal(err)
		}
		return nodes[1].Stats().UnitsHeld > 0, "b holds no lease"
	})
	// ... and a's denial of the whole capacity reaches c (half the bucket
	// is spent: it refills in half an hour).
	if res, err := nodes[0].Check(ctx, p, "k", 50_000); err != nil || !res.Allowed {
		t.Fatalf("a: %+v, %v; want half the capacity allowed", res, err)
	}
	if res, err := nodes[0].Check(ctx, p, "k", 100_000); err != nil || res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("a: %+v, %v; want denied by the store", res, err)
	}
	waitGossip(t, ms[2], "the denial", func(g node.GossipStats) bool { return g.DenialsReceived >= 1 })
	if res, _ := nodes[2].Check(ctx, p, "k", 100_000); res.Source != node.SourceDeniedCache {
		t.Fatalf("c before the reset: %+v; want the gossiped denial", res)
	}

	if err := nodes[0].Reset(ctx, "r", "k"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[1:] {
		waitGossip(t, m, "the reset", func(g node.GossipStats) bool { return g.ResetsReceived >= 1 })
	}
	if held := nodes[1].Stats().UnitsHeld; held != 0 {
		t.Fatalf("b still holds %d leased units after the reset", held)
	}
	before := stores[2].Calls()
	if res, err := nodes[2].Check(ctx, p, "k", 100_000); err != nil || !res.Allowed || res.Source != node.SourceStore || stores[2].Calls() != before+1 {
		t.Fatalf("c after the reset: %+v, %v; want the whole capacity allowed by the store", res, err)
	}
	// memberlist sends each message several times; a repeat must not reset
	// again (it would drop leases taken since).
	waitGossip(t, ms[1], "a retransmitted reset", func(g node.GossipStats) bool { return g.DuplicateResets >= 1 })
	if g := ms[1].Stats().Gossip; g.ResetsReceived != 1 {
		t.Fatalf("b applied %d resets; want 1", g.ResetsReceived)
	}
}

// A process that is not a quotad member sending garbage, or well-formed
// gossip, gets it dropped and counted; the node carries on. (Its join is
// refused: it advertises no quotad fingerprint.)
func TestMalformedGossipIsDroppedAndCounted(t *testing.T) {
	r := redistest.Start(t)
	fn := newFaultNet()
	nodes, _, ms := gossipCluster(t, r, fn, 1, node.Config{})
	mc := memberlist.DefaultLANConfig()
	mc.Name, mc.Transport, mc.LogOutput = "rogue", fn.newEnd(), discard{}
	mc.ProbeInterval, mc.GossipInterval = 100*time.Millisecond, 50*time.Millisecond
	rogue, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Shutdown()
	// a refuses the state exchange, but the rogue has already read a's
	// state, so it knows a's address.
	_, _ = rogue.Join([]string{ms[0].end.addr})
	var target *memberlist.Node
	for _, n := range rogue.Members() {
		if n.Name == "a" {
			target = n
		}
	}
	if target == nil {
		t.Fatal("the rogue did not learn a's address")
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		return ms[0].Stats().Refused > 0, "a has not refused the rogue"
	})
	if ms[0].Size() != 1 {
		t.Fatalf("a counts %d members; the rogue was refused", ms[0].Size())
	}
	header := func(v byte) []byte { return append([]byte{v}, make([]byte, 24)...) }
	// (memberlist does not deliver empty messages.)
	msgs := [][]byte{
		{2}, append(header(2), 5, 1), append(header(2), 200), // malformed: truncated header, truncated message, length past the end
		[]byte("not gossip at all"), append(header(1), 1, 1), // another version
		append(header(2), 3, 2, 1, 'k'), // well-formed, from nobody a knows
	}
	for _, b := range msgs {
		if err := rogue.SendReliable(target, b); err != nil {
			t.Fatal(err)
		}
	}
	waitGossip(t, ms[0], "the garbage", func(g node.GossipStats) bool {
		return g.Malformed+g.Unsupported+g.UnknownSender == int64(len(msgs))
	})
	if g := ms[0].Stats().Gossip; g.Malformed != 3 || g.Unsupported != 2 || g.UnknownSender != 1 || g.DenialsReceived != 0 || g.ResetsReceived != 0 {
		t.Fatalf("gossip counters %+v; want 3 malformed, 2 of another version, 1 from an unknown sender, nothing applied", g)
	}
	p := node.Policy{Name: "m", Limit: fiveAMinute}
	if res, err := nodes[0].Check(context.Background(), p, "k", 1); err != nil || !res.Allowed {
		t.Fatalf("check after garbage: %+v, %v", res, err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Lease caps divide by the live cluster size: when a member leaves, each
// remaining node may hold a larger share of a key.
func TestLeaseCapsFollowClusterSize(t *testing.T) {
	r := redistest.Start(t)
	cfg := node.Config{Lease: node.LeaseConfig{Horizon: 50 * time.Millisecond, Hold: 100 * time.Millisecond, MaxFraction: 0.001}}
	nodes, _, ms := gossipCluster(t, r, newFaultNet(), 3, cfg)
	// 0.1% of a million: 1000 units in leases cluster-wide, 333 per node
	// of three and 500 per node of two.
	p := node.Policy{Name: "caps", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000, Period: time.Minute}}
	ctx := context.Background()
	// grants checks key on a until a lease grant beyond cost matches done,
	// and returns the largest grant seen.
	grants := func(done func(held int64) bool) int64 {
		var largest int64
		waitFor(t, 10*time.Second, func() (bool, string) {
			for range 1000 {
				res, err := nodes[0].Check(ctx, p, "hot", 1)
				if err != nil || !res.Allowed {
					t.Fatalf("check: %+v, %v", res, err)
				}
				if res.Source != node.SourceStore {
					continue
				}
				// Right after a store call the node holds exactly the new
				// grant: the previous one's leftovers went back first.
				held := nodes[0].Stats().UnitsHeld
				largest = max(largest, held)
				if done(held) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("largest lease grant so far %d units", largest)
		})
		return largest
	}
	if largest := grants(func(held int64) bool { return held >= 300 }); largest > 333 {
		t.Fatalf("a node of three held %d units; its cap is 333", largest)
	}
	if s := nodes[0].ClusterStatus(); s.Size != 3 || s.LeaseShare != 0.001/3 {
		t.Fatalf("status size %d, lease share %g; want 3 and 0.001/3", s.Size, s.LeaseShare)
	}

	if err := ms[2].Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*testDeadAfter, func() (bool, string) { return ms[0].Size() == 2, "a still counts c" })
	if largest := grants(func(held int64) bool { return held > 333 }); largest > 500 {
		t.Fatalf("a node of two held %d units; its cap is 500", largest)
	}
	if s := nodes[0].ClusterStatus(); s.Size != 2 || s.LeaseShare != 0.001/2 {
		t.Fatalf("status size %d, lease share %g; want 2 and 0.001/2", s.Size, s.LeaseShare)
	}
}

// A cluster of nodes on their own memory stores would admit the limit
// once per node: New refuses it, saying what to configure.
func TestClusterNeedsASharedStore(t *testing.T) {
	m := startMember(t, newFaultNet(), "solo", nil, nil)
	n, err := node.New(node.Config{Cluster: m.Membership}, memory.New(nil, 0), nil)
	if err == nil {
		n.Close()
		t.Fatal("New accepted a cluster on the memory store")
	}
	if !errors.Is(err, node.ErrSharedStoreRequired) || !strings.Contains(err.Error(), "configure Redis") {
		t.Fatalf("error %q; want ErrSharedStoreRequired telling to configure Redis", err)
	}
}
