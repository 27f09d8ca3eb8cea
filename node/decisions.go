package node

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotad/quotad/topkeys"
)

// This file counts decisions, by policy, outcome and source, and the keys
// denied most: Decisions, TopDenied and the quotad.decisions metric.

// TopDeniedInterval is how often the node starts a new interval of its top
// denied keys: TopDenied spans the current interval and the
// Config.TopKeys.Intervals−1 before it (4 to 5 minutes by default).
const TopDeniedInterval = time.Minute

// count records a decision for Decisions, TopDenied and the decisions
// metric. For a known policy it is one map read and one atomic add; a
// denial also takes the policy's lock in the top-keys tracker. Neither
// allocates.
func (n *Node) count(policy, key string, res Result) {
	n.countLimited(policy, key, res, !res.Allowed)
}

// countLimited is count for a decision that may be a denial of key for
// another's sake (an item of a denied all-or-nothing batch that fitted on
// its own): limited says whether key's own limit (or its failure mode)
// denied it, and only then does the denial count among the top denied
// keys.
func (n *Node) countLimited(policy, key string, res Result, limited bool) {
	n.decisions.get(policy).count(res)
	if limited {
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
// fail-closed policy), except the items of a denied all-or-nothing batch
// that fitted on their own (RetryAfter 0; see CheckAll): they were denied
// for another key's sake.
func (n *Node) TopDenied() topkeys.Report { return n.topDenied.Top() }

// policyCounts counts one policy's decisions by [allowed][source slot].
type policyCounts struct {
	policy string
	n      [2][sourceSlots]atomic.Int64
}

func (c *policyCounts) count(res Result) {
	allowed := 0
	if res.Allowed {
		allowed = 1
	}
	c.n[allowed][sourceSlot(res.Source)].Add(1)
}

// observe reports c's nonzero counts. It runs at collection, so building
// the attribute sets here costs checks nothing.
func (c *policyCounts) observe(o metric.Observer, inst metric.Int64Observable) {
	for allowed, outcome := range []string{"denied", "allowed"} {
		for slot := range sourceSlots {
			if v := c.n[allowed][slot].Load(); v > 0 {
				o.ObserveInt64(inst, v, metric.WithAttributeSet(attribute.NewSet(
					attrPolicy.String(c.policy), attrOutcome.String(outcome), attrSource.String(sourceLabel(slot)))))
			}
		}
	}
}

// policyLabels maps policy names to their decision counts. Reads are
// lock-free (an immutable map behind an atomic pointer) because every
// measured check does one; a new name copies the map, which happens at
// most maxPolicyLabels times.
type policyLabels struct {
	m     atomic.Pointer[map[string]*policyCounts]
	mu    sync.Mutex // serializes copies
	other *policyCounts
	// full is set once the map holds maxPolicyLabels names, so that a flood
	// of new names goes to other without taking mu.
	full atomic.Bool
}

// init fills the map with the configured policies.
func (l *policyLabels) init(configured []Policy) {
	m := make(map[string]*policyCounts, len(configured))
	for _, p := range configured {
		m[p.Name] = &policyCounts{policy: p.Name}
	}
	l.m.Store(&m)
	l.other = &policyCounts{policy: otherPolicyLabel}
}

// addConfigured gives policies that a reload configured their own label,
// past maxPolicyLabels if need be: configured policies always have one.
func (l *policyLabels) addConfigured(names []string) {
	if len(names) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.m.Load()
	m := make(map[string]*policyCounts, len(old)+len(names))
	for k, v := range old {
		m[k] = v
	}
	for _, name := range names {
		if _, ok := m[name]; !ok {
			m[name] = &policyCounts{policy: name}
		}
	}
	l.m.Store(&m)
}

func (l *policyLabels) get(policy string) *policyCounts {
	if c, ok := (*l.m.Load())[policy]; ok {
		return c
	}
	if l.full.Load() {
		return l.other
	}
	return l.add(policy)
}

func (l *policyLabels) add(policy string) *policyCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.m.Load()
	if c, ok := old[policy]; ok {
		return c
	}
	if len(old) >= maxPolicyLabels {
		l.full.Store(true)
		return l.other
	}
	m := make(map[string]*policyCounts, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	c := &policyCounts{policy: policy}
	m[policy] = c
	l.m.Store(&m)
	return c
}

// observe reports every policy's counts.
func (l *policyLabels) observe(o metric.Observer, inst metric.Int64Observable) {
	for _, c := range *l.m.Load() {
		c.observe(o, inst)
	}
	l.other.observe(o, inst)
}
