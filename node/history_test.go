package node_test

import (
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// The node's own ticker samples its decisions and store calls every
// second: once the checks are done, the samples add up to exactly the
// decisions made and calls sent, each sample on a whole second after the
// one before.
func TestHistoryAddsUpToTheDecisionsAndStoreCalls(t *testing.T) {
	api := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 2, Period: time.Hour}}
	n := newNode(t, remoteMemory{memory.New(nil, 0)}, node.Config{Policies: []node.Policy{api}})
	for range 3 {
		mustCheck(t, n, api, "u1")
	}
	for range 5 {
		mustCheck(t, n, api, "abuser")
	}
	calls := n.Stats().StoreCalls
	if calls == 0 {
		t.Fatal("no store calls counted: the test needs some to compare")
	}
	// Generous: the ticker fires every second; 20 s covers a starved
	// goroutine on a loaded machine.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var allowed, denied, store int64
		h := n.History()
		for i, s := range h {
			allowed, denied, store = allowed+s.Allowed, denied+s.Denied, store+s.StoreCalls
			if !s.At.Equal(s.At.Truncate(time.Second)) || (i > 0 && !s.At.After(h[i-1].At)) {
				t.Fatalf("sample %d at %s: want whole seconds, each after the one before: %+v", i, s.At, h)
			}
		}
		if allowed == 4 && denied == 4 && store == calls {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("history adds up to %d allowed, %d denied, %d store calls; want 4, 4 and %d", allowed, denied, store, calls)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The history is a ring: however long the node runs, it keeps the last
// node.HistorySamples samples, the newest last.
func TestHistoryKeepsTheLastSamplesOnly(t *testing.T) {
	n := newNode(t, memory.New(nil, 0), node.Config{})
	// An hour ahead, so that the node's own ticker, sampling the present,
	// only adds zeros to the newest of these samples.
	start := time.Now().Add(time.Hour).Truncate(time.Second)
	const ticks = node.HistorySamples + 100
	for i := range ticks {
		n.SampleHistory(start.Add(time.Duration(i) * time.Second))
	}
	h := n.History()
	if len(h) != node.HistorySamples {
		t.Fatalf("%d samples kept, want %d", len(h), node.HistorySamples)
	}
	if last := start.Add((ticks - 1) * time.Second); !h[len(h)-1].At.Equal(last) {
		t.Fatalf("newest sample at %s, want %s", h[len(h)-1].At, last)
	}
	if first := start.Add((ticks - node.HistorySamples) * time.Second); !h[0].At.Equal(first) {
		t.Fatalf("oldest sample at %s, want %s", h[0].At, first)
	}
}
