package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
)

// In a cluster of eight, more than the fan-out of three can reach at once,
// a denial one node gets from Redis goes to three random members that
// relay it: every other node answers the key from its denied cache without
// calling Redis, for no longer than Redis said, in whole milliseconds; and
// each takes the denial exactly once (when a node sends to every member,
// each takes both transmissions). A reset spreads the same way, taken once
// by each node, and drops the cached denial everywhere.
func TestDenialsSpreadThroughRelays(t *testing.T) {
	const k = 8
	if k-1 <= cluster.GossipFanout {
		t.Fatalf("%d peers do not exceed the fan-out %d: nothing would be relayed", k-1, cluster.GossipFanout)
	}
	r := redistest.Start(t)
	nodes, stores, ms := gossipCluster(t, r, newFaultNet(), k, node.Config{})
	ctx := context.Background()
	p := node.Policy{Name: "s", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Hour}}
	for i := range 5 {
		if res, err := nodes[0].Check(ctx, p, "k", 1); err != nil || !res.Allowed {
			t.Fatalf("check %d on a: %+v, %v", i+1, res, err)
		}
	}
	res, err := nodes[0].Check(ctx, p, "k", 1)
	if err != nil || res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("sixth check on a: %+v, %v; want denied by the store", res, err)
	}
	for _, m := range ms[1:] {
		waitGossip(t, m, "the denial", func(g node.GossipStats) bool { return g.DenialsReceived >= 1 })
	}
	for _, m := range ms {
		waitGossip(t, m, "the relays to go out", func(g node.GossipStats) bool { return g.Queued == 0 })
	}
	relayed := 0
	for i, n := range nodes[1:] {
		m := ms[i+1]
		if g := m.Stats().Gossip; g.DenialsReceived != 1 {
			t.Fatalf("%s took the denial %d times; want once, however many relays sent it", m.Name(), g.DenialsReceived)
		} else if g.Replayed > 0 {
			relayed++
		}
		before := stores[i+1].Calls()
		got, err := n.Check(ctx, p, "k", 1)
		if err != nil || got.Allowed || got.Source != node.SourceDeniedCache {
			t.Fatalf("%s: %+v, %v; want denied from the denied cache", m.Name(), got, err)
		}
		if got.RetryAfter <= 55*time.Minute || got.RetryAfter > res.RetryAfter || got.Limit != 5 {
			t.Fatalf("%s answered %+v; the store said %+v", m.Name(), got.Decision, res.Decision)
		}
		if got.RetryAfter%time.Millisecond != 0 || got.ResetAfter%time.Millisecond != 0 {
			t.Fatalf("%s answered waits of %s and %s; want whole milliseconds", m.Name(), got.RetryAfter, got.ResetAfter)
		}
		if calls := stores[i+1].Calls(); calls != before {
			t.Fatalf("%s made %d store calls for a relayed denial", m.Name(), calls-before)
		}
	}
	// Copies beyond the first, from other relays, are refused by number.
	if relayed == 0 {
		t.Fatal("no node got a second copy of the denial: nothing was relayed")
	}

	if err := nodes[0].Reset(ctx, "s", "k"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[1:] {
		waitGossip(t, m, "the reset", func(g node.GossipStats) bool { return g.ResetsReceived >= 1 })
	}
	deniedAgain := false
	for i, n := range nodes[1:] {
		if g := ms[i+1].Stats().Gossip; g.ResetsReceived != 1 || g.DuplicateResets != 0 {
			t.Fatalf("%s applied %d resets, ignored %d repeats; want the reset taken once", ms[i+1].Name(), g.ResetsReceived, g.DuplicateResets)
		}
		// The store decides again: the cached denial is gone. The limit is
		// 5, so the sixth check is denied by the store, and that new denial
		// spreads too: a node after it may answer from it.
		before := stores[i+1].Calls()
		got, err := n.Check(ctx, p, "k", 1)
		fromStore := err == nil && got.Source == node.SourceStore && stores[i+1].Calls() == before+1
		if !fromStore && !(deniedAgain && err == nil && got.Source == node.SourceDeniedCache && !got.Allowed) {
			t.Fatalf("%s after the reset: %+v, %v; want the store's answer", ms[i+1].Name(), got, err)
		}
		if fromStore && !got.Allowed {
			deniedAgain = true
		}
	}
}
