package rpc

import (
	"slices"
	"time"

	"github.com/quotad/quotad/node"
)

// historyJSON is the last minutes of a node's (or the cluster's) rates,
// what the console's chart draws when a page loads.
type historyJSON struct {
	// Step is how long each sample counts, "1s".
	Step string `json:"step"`
	// Samples are oldest first, at most node.HistorySamples.
	Samples []sampleJSON `json:"samples"`
}

// sampleJSON counts what was done in the step that ended at At (whole
// seconds): decisions allowed and denied, calls sent to the store.
type sampleJSON struct {
	At         time.Time `json:"at"`
	Allowed    int64     `json:"allowed"`
	Denied     int64     `json:"denied"`
	StoreCalls int64     `json:"store_calls"`
}

// nodeHistory is n's history as GET /status?history=1 shows it.
func nodeHistory(n *node.Node) *historyJSON {
	h := n.History()
	out := &historyJSON{Step: node.HistoryStep.String(), Samples: make([]sampleJSON, len(h))}
	for i, s := range h {
		out.Samples[i] = sampleJSON{At: s.At, Allowed: s.Allowed, Denied: s.Denied, StoreCalls: s.StoreCalls}
	}
	return out
}

// sumHistories adds up members' histories second by second: the samples
// of one second, from every member that has one, make the cluster's
// sample of that second. The newest node.HistorySamples seconds are kept.
func sumHistories(hs []*historyJSON) *historyJSON {
	bySecond := map[int64]*sampleJSON{}
	for _, h := range hs {
		if h == nil {
			continue
		}
		for _, s := range h.Samples {
			at := s.At.Truncate(time.Second)
			sum := bySecond[at.Unix()]
			if sum == nil {
				sum = &sampleJSON{At: at.UTC()}
				bySecond[at.Unix()] = sum
			}
			sum.Allowed += s.Allowed
			sum.Denied += s.Denied
			sum.StoreCalls += s.StoreCalls
		}
	}
	out := &historyJSON{Step: node.HistoryStep.String(), Samples: make([]sampleJSON, 0, len(bySecond))}
	for _, s := range bySecond {
		out.Samples = append(out.Samples, *s)
	}
	slices.SortFunc(out.Samples, func(a, b sampleJSON) int { return a.At.Compare(b.At) })
	if len(out.Samples) > node.HistorySamples {
		out.Samples = out.Samples[len(out.Samples)-node.HistorySamples:]
	}
	return out
}
