package topkeys_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/quotad/quotad/topkeys"
)

// policyTop is tr's report of policy p; the test fails if it has none.
func policyTop(t *testing.T, tr *topkeys.Tracker, p string) topkeys.PolicyTop {
	t.Helper()
	for _, top := range tr.Top().Policies {
		if top.Policy == p {
			return top
		}
	}
	t.Fatalf("no report of policy %q", p)
	return topkeys.PolicyTop{}
}

// Members that each saw fewer keys than their counters list every key
// exactly, so the merge of their reports is the exact sum per key, with
// no error, and a key one member never saw adds nothing there.
func TestMergeOfExactReportsIsTheExactSum(t *testing.T) {
	a, b := newTracker(t, topkeys.Config{}), newTracker(t, topkeys.Config{})
	add := func(tr *topkeys.Tracker, key string, n int) {
		for range n {
			tr.Add("api", key)
		}
	}
	add(a, "x", 10)
	add(a, "y", 5)
	add(b, "x", 7)
	add(b, "z", 9)
	ta, tb := policyTop(t, a, "api"), policyTop(t, b, "api")
	if ta.Unlisted != 0 || tb.Unlisted != 0 {
		t.Fatalf("reports of 2 keys each say unlisted keys may have %d and %d denials, want 0", ta.Unlisted, tb.Unlisted)
	}
	m := topkeys.Merge("api", []topkeys.PolicyTop{ta, tb}, 20)
	want := []topkeys.Entry{{Key: "x", Count: 17}, {Key: "z", Count: 9}, {Key: "y", Count: 5}}
	if m.Policy != "api" || m.Denials != 31 || m.Unlisted != 0 || fmt.Sprint(m.Keys) != fmt.Sprint(want) {
		t.Fatalf("merged %+v, want policy api, 31 denials, unlisted 0, keys %v", m, want)
	}
	if cut := topkeys.Merge("api", []topkeys.PolicyTop{ta, tb}, 1); len(cut.Keys) != 1 || cut.Unlisted != 9 {
		t.Fatalf("merged to the top 1: %+v, want x alone and unlisted 9 (z's count)", cut)
	}
}

// Three members each see a share of one skewed stream, more keys than
// their counters hold: every key the merge lists has its true count
// across the members between Count − Error and Count, and every key it
// does not list was denied at most Unlisted times. This is the bound
// docs/console.md states.
func TestMergeBoundsHoldForASkewedStreamSplitAcrossMembers(t *testing.T) {
	stream, truth := skewedStream()
	rng := rand.New(rand.NewPCG(7, 11))
	members := []*topkeys.Tracker{newTracker(t, topkeys.Config{}), newTracker(t, topkeys.Config{}), newTracker(t, topkeys.Config{})}
	for _, k := range stream {
		// Uneven shares, as behind a load balancer that favours a member.
		i := 0
		if r := rng.IntN(10); r >= 5 {
			i = 1 + r%2
		}
		members[i].Add("api", k)
	}
	var tops []topkeys.PolicyTop
	for _, m := range members {
		tops = append(tops, policyTop(t, m, "api"))
	}
	m := topkeys.Merge("api", tops, 20)
	if m.Denials != uint64(len(stream)) {
		t.Fatalf("merged denials %d, want %d, every denial once", m.Denials, len(stream))
	}
	listed := map[string]bool{}
	for _, e := range m.Keys {
		listed[e.Key] = true
		if tr := truth[e.Key]; tr > e.Count || tr < e.Count-e.Error {
			t.Errorf("%s: true count %d outside [%d, %d]", e.Key, tr, e.Count-e.Error, e.Count)
		}
	}
	for k, tr := range truth {
		if !listed[k] && tr > m.Unlisted {
			t.Errorf("%s: denied %d times, not listed, but the merge says unlisted keys have at most %d", k, tr, m.Unlisted)
		}
	}
	// The heavy keys (5000 to 6900 denials each, among 100,000 single
	// ones) are what a reader must see: all 20 are listed.
	for i := range 20 {
		if k := fmt.Sprintf("heavy-%02d", i); !listed[k] {
			t.Errorf("%s (%d denials) is not among the merged top 20: %v", k, truth[k], m.Keys)
		}
	}
}
