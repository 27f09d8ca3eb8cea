package node

import (
	"context"
	"sort"
)

// This file is the configured policies: an immutable PolicySet, and
// SetPolicies, which swaps in a new one.

// PolicySet is the node's configured policies at one moment. It is
// immutable: SetPolicies installs a new set rather than changing one, so
// whoever resolves several policies against one set (a batch) sees them
// all from the same configuration. Safe for concurrent use.
type PolicySet struct {
	byName map[string]Policy
	sorted []Policy
}

// newPolicySet builds the set of ps, which Config.Validate accepted
// (names unique, each policy valid), resolving FailDefault to def so that
// status pages and ListPolicies show the mode that applies. Its policies
// are marked validated (NewPolicy): checks do not validate them again.
func newPolicySet(ps []Policy, def FailureMode) *PolicySet {
	s := &PolicySet{byName: make(map[string]Policy, len(ps)), sorted: make([]Policy, 0, len(ps))}
	for _, p := range ps {
		if p.OnStoreError == FailDefault {
			p.OnStoreError = def
		}
		p.valid = true
		s.byName[p.Name] = p
		s.sorted = append(s.sorted, p)
	}
	sort.Slice(s.sorted, func(i, j int) bool { return s.sorted[i].Name < s.sorted[j].Name })
	return s
}

// Policy returns the policy called name.
func (s *PolicySet) Policy(name string) (Policy, bool) {
	p, ok := s.byName[name]
	return p, ok
}

// All returns the policies sorted by name, in a slice the caller owns.
func (s *PolicySet) All() []Policy { return append([]Policy(nil), s.sorted...) }

// Len is the number of policies.
func (s *PolicySet) Len() int { return len(s.sorted) }

// PolicyChanges says what SetPolicies changed, by policy name, each list
// sorted.
type PolicyChanges struct {
	// Added and Removed are policies only the new or only the old set has.
	Added, Removed []string
	// Changed are policies in both sets whose limit, failure mode or lease
	// switch differ.
	Changed []string
}

// Empty reports whether nothing changed.
func (c PolicyChanges) Empty() bool { return len(c.Added)+len(c.Removed)+len(c.Changed) == 0 }

// SetPolicies replaces the configured policies with ps in one atomic step:
// a check resolves its policy in the old set or in the new one, never in a
// mix. ps is validated as Config.Policies is; on error nothing changes.
//
// A removed policy, and one whose limit or lease switch changed, loses
// this node's leases (their unused units go back to the store) and the
// denials the node remembers for its keys, so that no check under the new
// limit is answered from state taken under the old one. (The denied cache
// also never applies a denial made under another limit; see cache.Key.)
// Checks already running with the old policy finish with it.
//
// It blocks while the released units go back to the store, up to ctx.
// Calls are serialized; it is safe to call concurrently with checks.
func (n *Node) SetPolicies(ctx context.Context, ps []Policy) (PolicyChanges, error) {
	if err := (Config{Policies: ps, DefaultFailureMode: n.cfg.DefaultFailureMode, KeyPrefix: n.cfg.KeyPrefix}).Validate(); err != nil {
		return PolicyChanges{}, err
	}
	if err := keepsAll(n.keeper, ps); err != nil {
		return PolicyChanges{}, err
	}
	n.swapMu.Lock()
	defer n.swapMu.Unlock()
	next := newPolicySet(ps, n.cfg.DefaultFailureMode)
	prev := n.policies.Swap(next)

	var ch PolicyChanges
	stale := make(map[string]bool)
	for _, p := range next.sorted {
		old, ok := prev.byName[p.Name]
		switch {
		case !ok:
			ch.Added = append(ch.Added, p.Name)
		case old != p:
			ch.Changed = append(ch.Changed, p.Name)
			if old.Limit != p.Limit || old.Lease != p.Lease {
				stale[p.Name] = true
			}
		}
	}
	for _, p := range prev.sorted {
		if _, ok := next.byName[p.Name]; !ok {
			ch.Removed = append(ch.Removed, p.Name)
			stale[p.Name] = true
		}
	}
	n.decisions.addConfigured(ch.Added)
	if len(stale) > 0 {
		n.local.forgetPolicies(ctx, stale)
	}
	return ch, nil
}

// PolicySet returns the configured policies now.
func (n *Node) PolicySet() *PolicySet { return n.policies.Load() }
