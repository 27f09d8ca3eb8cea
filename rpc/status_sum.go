package rpc

import (
	"slices"
	"strings"

	"github.com/quotad/quotad/topkeys"
)

// This file adds up the members' GET /status pages into the cluster's:
// counts summed, top denied keys merged, the members on other policies or
// an older generation marked.

// addUp fills out's totals from the pages of the members that answered
// (pages[i] is out.Members[i]'s, nil when it did not answer).
func addUp(out *clusterStatusJSON, pages []*statusJSON, self statusJSON) {
	digests := map[string]int{}
	var histories []*historyJSON
	for i, p := range pages {
		if p == nil {
			continue
		}
		out.Answered++
		digests[p.Config.PoliciesSHA256]++
		if g := p.Config.Generation; g != nil && (out.Generation == nil || *g > *out.Generation) {
			v := *g
			out.Generation = &v
		}
		m := &out.Members[i]
		m.Answered, m.Error = true, ""
		m.Now, m.Config, m.Store = &p.Now, &p.Config, &p.Store
		m.Policies = make([]memberCountJSON, len(p.Policies))
		for j, pol := range p.Policies {
			m.Policies[j] = memberCountJSON{Name: pol.Name, Allowed: pol.Allowed, Denied: pol.Denied}
		}
		out.Store.Calls += p.Store.Calls
		out.Store.Errors += p.Store.Errors
		out.Store.Overloads += p.Store.Overloads
		if p.Store.Breaker == "open" {
			out.Store.BreakersOpen++
		}
		histories = append(histories, p.History)
	}
	out.Store.Describe = self.Store.Describe
	// The digest most members run; on a tie the node asked's, else the
	// least in order, so that the answer does not depend on map order.
	out.PoliciesSHA256 = self.Config.PoliciesSHA256
	for d, c := range digests {
		best := digests[out.PoliciesSHA256]
		if c > best || (c == best && out.PoliciesSHA256 != self.Config.PoliciesSHA256 && d < out.PoliciesSHA256) {
			out.PoliciesSHA256 = d
		}
	}
	for i := range out.Members {
		m := &out.Members[i]
		if m.Config == nil {
			continue
		}
		m.OtherPolicies = m.Config.PoliciesSHA256 != out.PoliciesSHA256
		m.GenerationBehind = m.Config.Generation != nil && out.Generation != nil && *m.Config.Generation < *out.Generation
	}
	out.Policies = addUpPolicies(pages, self)
	if self.History != nil {
		out.History = sumHistories(histories)
	}
}

// addUpPolicies adds up the pages' decisions per policy and merges their
// top denied keys. A policy's limit is the node asked's, else the first
// member's that has it.
func addUpPolicies(pages []*statusJSON, self statusJSON) []policyJSON {
	byName := map[string]*policyJSON{}
	tops := map[string][]topkeys.PolicyTop{}
	limit := map[string]int{}
	for _, p := range pages {
		if p == nil {
			continue
		}
		for _, pol := range p.Policies {
			sum := byName[pol.Name]
			if sum == nil {
				sum = &policyJSON{Name: pol.Name}
				byName[pol.Name] = sum
			}
			sum.Configured = sum.Configured || pol.Configured
			if sum.Limit == nil {
				sum.Limit = pol.Limit
			}
			sum.Allowed = addSources(sum.Allowed, pol.Allowed)
			sum.Denied = addSources(sum.Denied, pol.Denied)
			if t := pol.TopDenied; t != nil {
				tops[pol.Name] = append(tops[pol.Name], memberTop(pol.Name, t))
				limit[pol.Name] = max(limit[pol.Name], len(t.Keys))
			}
		}
	}
	for _, pol := range self.Policies {
		if pol.Limit != nil {
			byName[pol.Name].Limit = pol.Limit
		}
	}
	out := make([]policyJSON, 0, len(byName))
	for name, p := range byName {
		if ts := tops[name]; len(ts) > 0 {
			m := topkeys.Merge(name, ts, limit[name])
			p.TopDenied = &topDeniedJSON{Denials: m.Denials, Keys: make([]topKeyJSON, len(m.Keys)), Unlisted: &m.Unlisted}
			for i, e := range m.Keys {
				p.TopDenied.Keys[i] = topKeyJSON{Key: e.Key, Count: e.Count, Error: e.Error}
			}
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b policyJSON) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// memberTop is a member's top_denied as topkeys reports it. A member that
// does not say how often an unlisted key may have been denied (a quotad
// older than this one) is taken at its lowest listed count, which bounds
// every key it did not list.
func memberTop(policy string, t *topDeniedJSON) topkeys.PolicyTop {
	top := topkeys.PolicyTop{Policy: policy, Denials: t.Denials, Keys: make([]topkeys.Entry, len(t.Keys))}
	for i, k := range t.Keys {
		top.Keys[i] = topkeys.Entry{Key: k.Key, Count: k.Count, Error: k.Error}
	}
	switch {
	case t.Unlisted != nil:
		top.Unlisted = *t.Unlisted
	case len(t.Keys) > 0:
		top.Unlisted = t.Keys[len(t.Keys)-1].Count
	}
	return top
}

func addSources(a, b sourcesJSON) sourcesJSON {
	return sourcesJSON{Store: a.Store + b.Store, Lease: a.Lease + b.Lease, DeniedCache: a.DeniedCache + b.DeniedCache,
		FailOpen: a.FailOpen + b.FailOpen, FailClosed: a.FailClosed + b.FailClosed}
}
