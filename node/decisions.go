package node

import (
	"slices"
	"strings"
	"time"

	"github.com/quotad/quotad/topkeys"
)

// TopDeniedInterval is how often the node starts a new interval of its top
// denied keys: TopDenied spans the current interval and the
// Config.TopKeys.Intervals−1 before it (4 to 5 minutes by default).
const TopDeniedInterval = time.Minute

// count records a decision for Decisions, TopDenied and the decisions
// metric. For a known policy it is one map read and one atomic add; a
// denial also takes the policy's lock in the top-keys tracker. Neither
// allocates.
func (n *Node) count(policy, key string, res Result) {
	n.decisions.get(policy).count(res)
	if !res.Allowed {
		n.topDenied.Add(policy, key)
	}
}

// SourceCounts counts decisions by who made them (see Source).
type SourceCounts struct {
	Store, Lease, DeniedCache, FailOpen, FailClosed int64
}

// PolicyDecisions is one policy's decisions since the node started.
type PolicyDecisions struct {
	// Policy is a configured policy's name or an inline limit's namespace.
	// Past 1000 names, further namespaces are counted together under
	// "(other)", which cannot be a policy's name.
	Policy string
	// Configured says whether Policy is a configured policy.
	Configured      bool
	Allowed, Denied SourceCounts
}

// Decisions returns the decisions of every configured policy (with zero
// counts if none) and of every inline namespace used since the node
// started, sorted by name. It reads atomics and may run at any time.
func (n *Node) Decisions() []PolicyDecisions {
	m := *n.decisions.m.Load()
	set := n.policies.Load()
	out := make([]PolicyDecisions, 0, len(m)+1)
	for name, c := range m {
		_, configured := set.Policy(name)
		out = append(out, c.snapshot(configured))
	}
	if o := n.decisions.other.snapshot(false); o.Allowed != (SourceCounts{}) || o.Denied != (SourceCounts{}) {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b PolicyDecisions) int { return strings.Compare(a.Policy, b.Policy) })
	return out
}

func (c *policyCounts) snapshot(configured bool) PolicyDecisions {
	bySource := func(allowed int) SourceCounts {
		n := &c.n[allowed]
		return SourceCounts{
			Store: n[SourceStore].Load(), Lease: n[SourceLease].Load(), DeniedCache: n[SourceDeniedCache].Load(),
			FailOpen: n[SourceFailOpen].Load(), FailClosed: n[SourceFailClosed].Load(),
		}
	}
	return PolicyDecisions{Policy: c.policy, Configured: configured, Allowed: bySource(1), Denied: bySource(0)}
}

// TopDenied reports, per policy, the keys this node denied most in the
// current and the last few intervals of TopDeniedInterval, from a
// fixed-memory sketch (package topkeys): counts are bounded estimates.
// Every denial counts, whoever decided it (store, denied cache, a
// fail-closed policy).
func (n *Node) TopDenied() topkeys.Report { return n.topDenied.Top() }
