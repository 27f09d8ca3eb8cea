package node

import (
	"sync"
	"time"
)

// This file is the node's short memory of its own rates: every second it
// samples how many decisions it made and store calls it sent, and keeps
// the last HistorySamples samples, so that a status page loaded now can
// draw the last minutes at once instead of starting empty.

// HistoryStep is how often the node samples its history; HistorySamples
// is how many samples History keeps: 5 minutes, in fixed memory (a ring
// of HistorySamples samples of 48 bytes, 14,400 bytes in all).
const (
	HistoryStep    = time.Second
	HistorySamples = 300
)

// HistorySample counts what the node did in the step that ended at At.
type HistorySample struct {
	// At is the end of the step, in whole seconds (the sampling time
	// rounded), so that the samples of nodes with synchronized clocks
	// fall on the same seconds and add up.
	At time.Time
	// Allowed and Denied count decisions of every policy and source;
	// StoreCalls counts the calls sent to a remote store (0 for the
	// memory store).
	Allowed, Denied, StoreCalls int64
}

// history is the ring of samples and the totals of the last sample,
// from which the next one is the difference. Its lock is held for a copy
// at most.
type history struct {
	mu      sync.Mutex
	ring    [HistorySamples]HistorySample
	next, n int
	// last are the totals at the previous sample; primed says there was
	// one.
	last   HistorySample
	primed bool
}

// sampleHistory records one sample of the node's totals as of now.
// Called by the node's ticker goroutine only.
func (n *Node) sampleHistory(now time.Time) {
	total := HistorySample{At: now.Round(time.Second).UTC()}
	for _, d := range n.Decisions() {
		total.Allowed += d.Allowed.Store + d.Allowed.Lease + d.Allowed.DeniedCache + d.Allowed.FailOpen + d.Allowed.FailClosed
		total.Denied += d.Denied.Store + d.Denied.Lease + d.Denied.DeniedCache + d.Denied.FailOpen + d.Denied.FailClosed
	}
	if n.breaker != nil {
		total.StoreCalls = n.breaker.calls.Load()
	}
	h := &n.history
	h.mu.Lock()
	defer h.mu.Unlock()
	last, primed := h.last, h.primed
	h.last, h.primed = total, true
	if !primed {
		return
	}
	s := HistorySample{At: total.At, Allowed: total.Allowed - last.Allowed, Denied: total.Denied - last.Denied, StoreCalls: total.StoreCalls - last.StoreCalls}
	// A tick that came early rounds to the second of the one before: it
	// adds to that sample rather than making a second one for the same
	// second.
	if h.n > 0 {
		prev := &h.ring[(h.next+HistorySamples-1)%HistorySamples]
		if !s.At.After(prev.At) {
			prev.Allowed += s.Allowed
			prev.Denied += s.Denied
			prev.StoreCalls += s.StoreCalls
			return
		}
	}
	h.ring[h.next] = s
	h.next = (h.next + 1) % HistorySamples
	h.n = min(h.n+1, HistorySamples)
}

// History returns the node's samples, oldest first: at most
// HistorySamples, one per HistoryStep since the node started (the first
// a step after it started). It copies them under a lock and may run at
// any time.
func (n *Node) History() []HistorySample {
	h := &n.history
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]HistorySample, 0, h.n)
	for i := range h.n {
		out = append(out, h.ring[(h.next-h.n+i+HistorySamples)%HistorySamples])
	}
	return out
}
